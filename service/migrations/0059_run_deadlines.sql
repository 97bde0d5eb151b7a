-- Run deadlines: a default deadline per workflow name (workflow_deadlines), which
-- run_submit applies to a run submitted without one, and run_deadlines_fire, which the
-- servers' upkeep calls to cancel the running runs whose deadline has passed.

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

-- run_submit: without p_deadline, the workflow's default deadline, if any.
CREATE OR REPLACE FUNCTION cyclone.run_submit(
    p_run_id uuid, p_workflow text, p_submit_key text, p_input jsonb, p_nodes jsonb,
    p_start_at timestamptz DEFAULT NULL, p_priority integer DEFAULT 0,
    p_tags jsonb DEFAULT NULL, p_deadline timestamptz DEFAULT NULL,
    p_traceparent text DEFAULT NULL,
    OUT run_id uuid, OUT created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    v_count integer := jsonb_array_length(p_nodes);
    v_ready timestamptz := greatest(v_now, coalesce(p_start_at, v_now));
    v_key   record;
    v_deadline timestamptz;
BEGIN
    IF p_submit_key IS NOT NULL THEN
        p_run_id := cyclone.submit_key_id(p_workflow, p_submit_key);
        -- A concurrent SubmitOnce with the same key waits here for the first to end.
        INSERT INTO cyclone.submit_keys (key_id, workflow, submit_key, run_id, created_at)
        VALUES (p_run_id, p_workflow, p_submit_key, p_run_id, v_now)
        ON CONFLICT (key_id) DO NOTHING;
        IF NOT FOUND THEN
            SELECT k.run_id, k.workflow, k.submit_key INTO v_key FROM cyclone.submit_keys k
             WHERE k.key_id = p_run_id;
            -- Two keys with one SHA-256 prefix: refused rather than answered wrongly.
            IF v_key.workflow <> p_workflow OR v_key.submit_key <> p_submit_key THEN
                RAISE EXCEPTION 'submit key % of workflow % has the id of another key',
                    p_submit_key, p_workflow USING ERRCODE = 'CY004';
            END IF;
            run_id := v_key.run_id;
            created := false;
            RETURN;
        END IF;
    END IF;

    -- Read first: Citus takes no subquery in an INSERT.
    v_deadline := coalesce(p_deadline, v_now + (SELECT d.deadline
                                                  FROM cyclone.workflow_deadlines d
                                                 WHERE d.workflow = p_workflow));
    INSERT INTO cyclone.runs (run_id, workflow, submit_key, status, input, steps_total,
                              steps_open, created_at, updated_at, priority, start_at, tags,
                              deadline, traceparent)
    VALUES (p_run_id, p_workflow, p_submit_key, 'running', p_input, v_count, v_count,
            v_now, v_now, coalesce(p_priority, 0), p_start_at, p_tags, v_deadline,
            p_traceparent);
    IF p_tags IS NOT NULL THEN
        INSERT INTO cyclone.run_tags (run_id, key, value, created_at)
        SELECT p_run_id, t.key, t.value, v_now FROM jsonb_each_text(p_tags) t;
    END IF;

    INSERT INTO cyclone.steps (run_id, node, position, action, status, trigger_rule, depends_on,
                               dependents, deps_open, max_attempts, attempt_budget,
                               initial_backoff, max_backoff, backoff_multiplier, timeout,
                               input, available_at, priority, concurrency_key,
                               concurrency_limit)
    SELECT p_run_id, n.name, n.position, n.action,
           CASE WHEN cardinality(n.depends_on) = 0 THEN 'available' ELSE 'pending' END,
           n.trigger_rule, n.depends_on, n.dependents, cardinality(n.depends_on),
           n.max_attempts, n.max_attempts, make_interval(secs => n.initial_backoff_s),
           make_interval(secs => n.max_backoff_s), n.backoff_multiplier,
           make_interval(secs => n.timeout_s), n.input,
           CASE WHEN cardinality(n.depends_on) = 0 THEN v_ready END,
           coalesce(n.priority, p_priority, 0), n.concurrency_key, n.concurrency_limit
      FROM jsonb_to_recordset(p_nodes) AS n(
               name text, position integer, action text, depends_on text[], dependents text[],
               trigger_rule text, max_attempts integer, initial_backoff_s float8,
               max_backoff_s float8, backoff_multiplier float8, timeout_s float8, input jsonb,
               priority integer, concurrency_key text, concurrency_limit integer);

    -- Also for a run that starts later: a waiting claim that wakes for nothing sets
    -- its timer by the earliest available_at (step_next_due), now the start time.
    PERFORM cyclone._notify_ready(array_agg(e.node->>'action'))
       FROM jsonb_array_elements(p_nodes) e(node)
      WHERE jsonb_array_length(e.node->'depends_on') = 0;
    run_id := p_run_id;
    created := true;
END;
$$;
