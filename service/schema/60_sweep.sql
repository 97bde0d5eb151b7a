-- The recovery sweep: leases that expired with no outcome.

-- Takes up to p_limit running steps whose lease expired, oldest expiry first, in runs
-- that are running (run rows taken with SKIP LOCKED, each step re-checked by its token
-- and expiry, so any number of sweepers never fight). Each becomes available at once,
-- remembered as effect_uncertain (the next claim decides: an unsafe claimer blocks the
-- run, any other runs it again), or discarded when out of attempts (attempt - resumes
-- >= max_attempts: claims that resumed a wait do not count) and its holder did
-- not mark the action unsafe (its dependents then judged by _settle). A lease_expired
-- error is recorded either way. Steps of blocked and cancelled runs are left alone.
-- Returns each step reclaimed: run, node, action, the attempt whose lease expired, the
-- worker that held it and the status it was left in (for the server's logs and
-- metrics). Called by each server's background sweep loop.
CREATE FUNCTION cyclone.sweep_steps(p_limit integer)
RETURNS TABLE (run_id uuid, node text, action text, attempt integer, worker_id text,
               status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := cyclone.now();
    v_cand record;
    v_step record;
BEGIN
    FOR v_cand IN
        SELECT s.run_id, s.node, s.lease_token FROM cyclone.steps s
         WHERE s.status = 'running' AND s.lease_expires_at <= v_now
         ORDER BY s.lease_expires_at LIMIT p_limit
    LOOP
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM cyclone.runs r
             WHERE r.run_id = v_cand.run_id AND r.status = 'running'
               FOR NO KEY UPDATE SKIP LOCKED);
        UPDATE cyclone.steps s
           SET status = CASE WHEN s.attempt - s.resumes >= s.max_attempts AND NOT s.unsafe
                             THEN 'discarded' ELSE 'available' END,
               available_at = CASE WHEN s.attempt - s.resumes >= s.max_attempts AND NOT s.unsafe
                                   THEN NULL ELSE v_now END,
               finished_at = CASE WHEN s.attempt - s.resumes >= s.max_attempts AND NOT s.unsafe
                                  THEN v_now END,
               effect_uncertain = true,
               lease_expires_at = NULL
         WHERE s.run_id = v_cand.run_id AND s.node = v_cand.node AND s.status = 'running'
           AND s.lease_token = v_cand.lease_token AND s.lease_expires_at <= v_now
        RETURNING s.status, s.attempt, s.action, s.worker_id INTO v_step;
        CONTINUE WHEN NOT FOUND;
        INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
        VALUES (v_cand.run_id, v_cand.node, v_step.attempt, 'lease_expired', 'LeaseExpired',
                format('lease of worker %s expired with no outcome', v_step.worker_id),
                v_step.status = 'available', v_now);
        IF v_step.status = 'discarded' THEN
            PERFORM cyclone._settle(v_cand.run_id, ARRAY[v_cand.node], '{}', 1);
        ELSE
            PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
        END IF;
        run_id := v_cand.run_id;
        node := v_cand.node;
        action := v_step.action;
        attempt := v_step.attempt;
        worker_id := v_step.worker_id;
        status := v_step.status;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- sweep_steps, returning only how many steps it reclaimed. The server calls sweep_steps;
-- this one is for tests and operators at a psql prompt.
CREATE FUNCTION cyclone.sweep(p_limit integer) RETURNS integer
LANGUAGE sql AS $$
    SELECT count(*)::integer FROM cyclone.sweep_steps(p_limit)
$$;
