-- The recovery sweep: leases that expired with no outcome.

-- Takes up to p_limit running steps whose lease expired, oldest expiry first, in runs
-- that are running (run rows taken with SKIP LOCKED, each step re-checked by its token
-- and expiry under its row lock, so any number of sweepers never fight). A lease that
-- lapsed before the step's deadline means its worker was lost (it died, froze or lost
-- its connection): the attempt counts as a recovery (recoveries + 1), not against the
-- node's retry policy, and the worker is marked unhealthy in cyclone.worker_health (it
-- is handed nothing until it shows it is alive). A lease that ran to the deadline is the
-- step's timeout: that attempt counts against the retry policy as a failure would.
-- Each step becomes available at once (held pending in a paused run, until run_resume),
-- remembered as effect_uncertain (the next claim
-- decides: an unsafe claimer blocks the run, any other runs it again), or discarded
-- when its holder did not mark the action unsafe and either its worker was lost more
-- than p_max_recoveries times (the server's --max-recoveries) or it is out of attempts
-- (attempt - resumes - recoveries >= max_attempts: claims that resumed a wait and
-- attempts whose worker was lost do not count); its dependents are then judged by
-- _settle. An error of kind lease_expired is recorded either way: type WorkerLost
-- naming the worker and the recovery budget, or LeaseExpired at the deadline. Steps of
-- blocked and cancelled runs are left alone. The workers marked unhealthy are written
-- last, in worker order, so two sweeps never wait on each other.
-- Returns each step reclaimed: run, node, action, the attempt whose lease expired, the
-- worker that held it, the status it was left in and whether its worker was lost (for
-- the server's logs and metrics). Called by each server's background sweep loop.
CREATE FUNCTION cyclone.sweep_steps(p_limit integer, p_max_recoveries integer DEFAULT 10)
RETURNS TABLE (run_id uuid, node text, action text, attempt integer, worker_id text,
               status text, lost boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_cand    record;
    v_step    record;
    v_rec     integer;
    v_discard boolean;
    v_held    boolean;
    v_lost    text[] := '{}';
    v_reasons text[] := '{}';
BEGIN
    FOR v_cand IN
        SELECT s.run_id, s.node, s.lease_token FROM cyclone.steps s
         WHERE s.status = 'running' AND s.lease_expires_at <= v_now
         ORDER BY s.lease_expires_at LIMIT p_limit
    LOOP
        -- A paused run's step is held (pending) rather than made available.
        SELECT r.paused_at IS NOT NULL INTO v_held FROM cyclone.runs r
         WHERE r.run_id = v_cand.run_id AND r.status = 'running'
           FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        SELECT s.attempt, s.resumes, s.recoveries, s.max_attempts, s.unsafe, s.action,
               s.worker_id, s.lease_expires_at < s.deadline_at AS lost
          INTO v_step
          FROM cyclone.steps s
         WHERE s.run_id = v_cand.run_id AND s.node = v_cand.node AND s.status = 'running'
           AND s.lease_token = v_cand.lease_token AND s.lease_expires_at <= v_now
           FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        v_rec := v_step.recoveries + CASE WHEN v_step.lost THEN 1 ELSE 0 END;
        v_discard := NOT v_step.unsafe
                     AND (v_step.lost AND v_rec > p_max_recoveries
                          OR v_step.attempt - v_step.resumes - v_rec >= v_step.max_attempts);
        UPDATE cyclone.steps s
           SET status = CASE WHEN v_discard THEN 'discarded'
                             WHEN v_held THEN 'pending' ELSE 'available' END,
               available_at = CASE WHEN v_discard THEN NULL ELSE v_now END,
               finished_at = CASE WHEN v_discard THEN v_now END,
               effect_uncertain = true,
               lease_expires_at = NULL,
               recoveries = v_rec
         WHERE s.run_id = v_cand.run_id AND s.node = v_cand.node;
        INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
        VALUES (v_cand.run_id, v_cand.node, v_step.attempt, 'lease_expired',
                CASE WHEN v_step.lost THEN 'WorkerLost' ELSE 'LeaseExpired' END,
                CASE
                    WHEN NOT v_step.lost THEN
                        format('lease of worker %s ran to the step''s timeout with no outcome',
                               v_step.worker_id)
                    WHEN v_rec > p_max_recoveries THEN
                        format('worker %s lost: its lease lapsed with no outcome; the step '
                               'lost its worker %s times, past the recovery budget of %s '
                               '(the server''s --max-recoveries)',
                               v_step.worker_id, v_rec, p_max_recoveries)
                    ELSE
                        format('worker %s lost: its lease lapsed with no outcome (recovery '
                               '%s of %s; not counted as an attempt)',
                               v_step.worker_id, v_rec, p_max_recoveries)
                END,
                NOT v_discard, v_now);
        IF v_step.lost AND v_step.worker_id IS NOT NULL THEN
            v_lost := v_lost || v_step.worker_id;
            v_reasons := v_reasons || format('the lease of %s/%s attempt %s lapsed',
                                             v_cand.run_id, v_cand.node, v_step.attempt);
        END IF;
        IF v_discard THEN
            PERFORM cyclone._settle(v_cand.run_id, ARRAY[v_cand.node], '{}', 1);
        ELSIF NOT v_held THEN
            PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
        END IF;
        run_id := v_cand.run_id;
        node := v_cand.node;
        action := v_step.action;
        attempt := v_step.attempt;
        worker_id := v_step.worker_id;
        status := CASE WHEN v_discard THEN 'discarded'
                       WHEN v_held THEN 'pending' ELSE 'available' END;
        lost := v_step.lost;
        RETURN NEXT;
    END LOOP;
    INSERT INTO cyclone.worker_health AS h (worker_id, unhealthy_since, reason)
    SELECT DISTINCT ON (l.worker_id) l.worker_id, v_now, l.reason
      FROM unnest(v_lost, v_reasons) AS l(worker_id, reason)
     ORDER BY l.worker_id
        ON CONFLICT (worker_id) DO NOTHING;
END;
$$;

-- sweep_steps, returning only how many steps it reclaimed. The server calls sweep_steps;
-- this one is for tests and operators at a psql prompt.
CREATE FUNCTION cyclone.sweep(p_limit integer, p_max_recoveries integer DEFAULT 10)
RETURNS integer
LANGUAGE sql AS $$
    SELECT count(*)::integer FROM cyclone.sweep_steps(p_limit, p_max_recoveries)
$$;
