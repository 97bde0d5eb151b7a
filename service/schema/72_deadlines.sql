-- Run deadlines (docs/time-and-events.md, "Run deadlines"). A run's deadline is given to
-- Submit, or comes from its workflow's default (workflow_deadlines, applied by
-- run_submit: created_at + the default). At the deadline a running run is cancelled,
-- as CancelRun cancels it: every server's upkeep calls run_deadlines_fire every
-- --deadline-interval seconds.

-- The default deadline of each workflow name, set by an operator (AdminService
-- SetWorkflowDeadline): who set it, when and why. Not a run's table: keyed by its name.
CREATE TABLE cyclone.workflow_deadlines (
    workflow   text        PRIMARY KEY,
    deadline   interval    NOT NULL CHECK (deadline > interval '0'),
    set_by     text        NOT NULL,
    set_at     timestamptz NOT NULL,
    reason     text        NOT NULL DEFAULT ''
);

-- The running runs with a deadline, by deadline: the firing's read.
CREATE INDEX runs_deadline_idx ON cyclone.runs (deadline)
    WHERE status = 'running' AND deadline IS NOT NULL;

-- Cancels up to p_limit running runs whose deadline has passed, earliest first, each
-- through run_cancel (its unfinished steps cancelled, so that a running handler is told
-- by the answer to its next heartbeat; its descendant runs cancelled with it;
-- a parent waiting for it woken), with actor 'cyclone' and the reason "deadline
-- exceeded at <deadline>" in the run's audit. The candidates are read without locks;
-- each run is then taken only if no other transaction holds it (FOR NO KEY UPDATE SKIP
-- LOCKED) and it is still running and due under its lock, so that any number of
-- servers firing at once cancel each run once. A run that is blocked or failed at its
-- deadline is left to its operator (and cancelled at once if it runs again). Returns
-- each run cancelled with its deadline. Called by each server's upkeep loop.
CREATE FUNCTION cyclone.run_deadlines_fire(p_limit integer)
RETURNS TABLE (run_id uuid, deadline timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := cyclone.now();
    v_cand record;
BEGIN
    FOR v_cand IN
        SELECT r.run_id, r.deadline FROM cyclone.runs r
         WHERE r.status = 'running' AND r.deadline IS NOT NULL AND r.deadline <= v_now
         ORDER BY r.deadline LIMIT p_limit
    LOOP
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM cyclone.runs r
             WHERE r.run_id = v_cand.run_id AND r.status = 'running'
               AND r.deadline <= v_now
               FOR NO KEY UPDATE SKIP LOCKED);
        PERFORM cyclone.run_cancel(v_cand.run_id, 'cyclone',
                                   'deadline exceeded at ' || cyclone._when(v_cand.deadline));
        run_id := v_cand.run_id;
        deadline := v_cand.deadline;
        RETURN NEXT;
    END LOOP;
END;
$$;
