-- Plans that do not depend on statistics, and the failed upstream nodes handed to a
-- cleanup node with its claim.
--
-- Every statement on the claim, completion, sweep and retention paths now reaches the
-- rows of steps and runs by key or by ctid, so no plan can turn into a scan of the
-- whole table, whatever ANALYZE last saw and on every supported major version:
--
--   step_claim   updated the rows it had picked through a join that the planner may
--                run as a hash join over a sequential scan of steps (it does on
--                PostgreSQL 15 once steps is analyzed with a backlog: the generic
--                plan expects hundreds of picked rows). It now updates them by the
--                ctids it locked (a TID scan), and reads each claimed step's run
--                through a lateral lookup by run_id instead of a join.
--   _runs_close  checked a closing run for a discarded step with EXISTS, which the
--                planner may hash (one scan of every step per call; it does when
--                steps was never analyzed). Both that check and the run's error are
--                now one scalar lookup per closing run, through a partial index of
--                the discarded steps (small: it holds only failures), and the runs
--                are found by primary key.
--   runs_purge   deletes the runs it locked by their ctids, not through a semi-join.
--
-- A ctid is safe here because each statement locks the rows (FOR UPDATE SKIP LOCKED)
-- before it uses their ctids, in the same statement: a locked row cannot move. If a
-- row was changed by another transaction between this statement's snapshot and its
-- lock, the update by ctid may miss it; it then stays as it was (still available, or
-- not purged) for the next call. The updates re-check the status for that reason.
--
-- The claim also takes each action once, however often p_actions names it: the rows it
-- updated are joined back to the rows it picked, which must be one per step.
--
-- step_claim also returns upstream_failures: for a step whose trigger rule let it run
-- after a failure (deps_failed > 0), its direct upstream nodes that were discarded,
-- each with its last recorded error, and those that were skipped, with no error.

CREATE INDEX steps_discarded_idx ON cyclone.steps (run_id, finished_at, node)
    WHERE status = 'discarded';

DROP FUNCTION cyclone.step_claim(text, text[], text[], integer, interval);
CREATE FUNCTION cyclone.step_claim(
    p_worker text, p_actions text[], p_unsafe text[], p_limit integer, p_lease interval)
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb)
LANGUAGE plpgsql
-- As in 0011: the plan is the same walk of the ready index for every argument.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    IF cardinality(p_unsafe) > 0 THEN
        RETURN QUERY SELECT b.run_id, b.node, b.action, b.workflow, b.attempt, b.max_attempts,
                            NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::uuid,
                            NULL::timestamptz, NULL::timestamptz, NULL::jsonb, true, true,
                            NULL::float8, NULL::jsonb
                       FROM cyclone._block_uncertain(p_unsafe) b;
    END IF;

    RETURN QUERY
    WITH picked AS (
        SELECT c.row_id, c.run_id, c.node, c.effect_uncertain, c.available_at
          FROM (SELECT DISTINCT x FROM unnest(p_actions) x) AS a(action)
         CROSS JOIN LATERAL (
               SELECT s.ctid AS row_id, s.run_id, s.node, s.available_at, s.effect_uncertain
                 FROM cyclone.steps s
                WHERE s.status = 'available' AND s.action = a.action
                  AND s.available_at <= v_now
                  AND NOT (s.effect_uncertain AND s.action = ANY (p_unsafe))
                ORDER BY s.available_at
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED) c
         ORDER BY c.available_at
         LIMIT p_limit
    ), claimed AS (
        UPDATE cyclone.steps s
           SET status = 'running',
               attempt = s.attempt + 1,
               lease_token = gen_random_uuid(),
               started_at = v_now,
               last_heartbeat_at = v_now,
               deadline_at = v_now + s.timeout,
               lease_expires_at = v_now + least(p_lease, s.timeout),
               worker_id = p_worker,
               unsafe = s.action = ANY (p_unsafe),
               effect_uncertain = false
         WHERE s.ctid = ANY (ARRAY(SELECT p.row_id FROM picked p))
           AND s.status = 'available'
        RETURNING s.run_id, s.node, s.action, s.attempt, s.max_attempts, s.input,
                  s.depends_on, s.deps_failed, s.lease_token, s.lease_expires_at,
                  s.deadline_at, s.progress
    )
    SELECT c.run_id, c.node, c.action, r.workflow, c.attempt, c.max_attempts, c.input,
           r.input,
           CASE WHEN cardinality(c.depends_on) > 0 THEN (
               SELECT jsonb_object_agg(u.node, u.output) FROM cyclone.steps u
                WHERE u.run_id = c.run_id AND u.node = ANY (c.depends_on)
                  AND u.status = 'completed') END,
           c.lease_token, c.lease_expires_at, c.deadline_at, c.progress,
           p.effect_uncertain, false, extract(epoch FROM v_now - p.available_at)::float8,
           CASE WHEN c.deps_failed > 0 THEN (
               SELECT jsonb_agg(jsonb_build_object(
                          'node', u.node, 'status', u.status,
                          'error', CASE WHEN u.status = 'discarded' THEN (
                              SELECT jsonb_build_object(
                                         'attempt', e.attempt, 'kind', e.kind, 'type', e.type,
                                         'message', e.message, 'details', e.details,
                                         'retryable', e.retryable, 'at', e.at)
                                FROM cyclone.step_errors e
                               WHERE e.run_id = u.run_id AND e.node = u.node
                               ORDER BY e.at DESC, e.attempt DESC LIMIT 1) END)
                      ORDER BY u.position)
                 FROM cyclone.steps u
                WHERE u.run_id = c.run_id AND u.node = ANY (c.depends_on)
                  AND u.status IN ('discarded', 'skipped')) END
      FROM claimed c
      JOIN picked p ON p.run_id = c.run_id AND p.node = c.node
     -- OFFSET 0 keeps the lookup a subquery run once per claimed step, by key.
     CROSS JOIN LATERAL (SELECT r.workflow, r.input FROM cyclone.runs r
                          WHERE r.run_id = c.run_id OFFSET 0) r;
END;
$$;

-- As in 0010, with each run found by primary key, and the check for a discarded step
-- and the run's error each one scalar lookup per closing run (never a hashed scan).
CREATE OR REPLACE FUNCTION cyclone._runs_close(p_runs uuid[], p_closed integer[],
                                               p_now timestamptz)
RETURNS TABLE (run_id uuid, status text)
LANGUAGE sql AS $$
    UPDATE cyclone.runs r
       SET steps_open = r.steps_open - c.closed,
           updated_at = p_now,
           status = CASE
               WHEN r.steps_open > c.closed OR r.status <> 'running' THEN r.status
               WHEN (SELECT true FROM cyclone.steps s
                      WHERE s.run_id = r.run_id AND s.status = 'discarded' LIMIT 1)
               THEN 'failed'
               ELSE 'completed' END,
           finished_at = CASE
               WHEN r.steps_open > c.closed OR r.status <> 'running' THEN r.finished_at
               ELSE p_now END,
           error = CASE
               WHEN r.steps_open > c.closed OR r.status <> 'running' THEN r.error
               ELSE (SELECT jsonb_build_object(
                                'kind', 'StepDiscarded',
                                'message', format('node %s was discarded at attempt %s',
                                                  s.node, s.attempt),
                                'node', s.node, 'attempt', s.attempt,
                                'started_at', s.started_at)
                       FROM cyclone.steps s
                      WHERE s.run_id = r.run_id AND s.status = 'discarded'
                      ORDER BY s.finished_at, s.node LIMIT 1) END
      FROM unnest(p_runs, p_closed) AS c(run_id, closed)
     WHERE r.run_id = c.run_id AND r.run_id = ANY (p_runs)
    RETURNING r.run_id, r.status
$$;

-- As in 0009, deleting the locked runs by ctid.
CREATE OR REPLACE FUNCTION cyclone.runs_purge(p_age interval, p_failed boolean, p_limit integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_before timestamptz := cyclone.now() - p_age;
    v_count  integer;
BEGIN
    IF p_failed THEN
        DELETE FROM cyclone.runs r
         WHERE r.ctid = ANY (ARRAY(
               SELECT o.ctid FROM cyclone.runs o
                WHERE o.status = 'failed' AND o.finished_at < v_before
                ORDER BY o.finished_at
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED))
           AND r.status = 'failed';
    ELSE
        DELETE FROM cyclone.runs r
         WHERE r.ctid = ANY (ARRAY(
               SELECT o.ctid FROM cyclone.runs o
                WHERE o.status IN ('completed', 'cancelled') AND o.finished_at < v_before
                ORDER BY o.finished_at
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED))
           AND r.status IN ('completed', 'cancelled');
    END IF;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
