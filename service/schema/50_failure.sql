-- Complete with a failure.

-- Records a failed attempt of a held step (running, same token, lease not expired). A
-- retryable failure with attempts left (attempt - resumes - recoveries < max_attempts: a
-- claim that resumed the node after a wait, or whose worker was lost, uses up no
-- attempt) makes the step
-- available again after p_retry_after, or else after the node's exponential backoff
-- less a random jitter of up to half (_backoff); otherwise the step is discarded and
-- its dependents judged (_settle). The error joins the step's history (kind handler).
-- CY001 when the lease is lost. Does not look at the run's status: step_fail does.
-- Called only by step_fail.
CREATE FUNCTION cyclone._step_fail_unheld(
    p_run_id uuid, p_node text, p_lease_token uuid, p_type text, p_message text,
    p_details text, p_retryable boolean, p_retry_after interval)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
    v_jitter float8 := random();
BEGIN
    UPDATE cyclone.steps s
       SET status = CASE WHEN p_retryable
                              AND s.attempt - s.resumes - s.recoveries < s.max_attempts
                         THEN 'available' ELSE 'discarded' END,
           available_at = CASE WHEN p_retryable
                                    AND s.attempt - s.resumes - s.recoveries < s.max_attempts
                               THEN cyclone._later(v_now, coalesce(
                                        p_retry_after,
                                        cyclone._backoff(s.initial_backoff, s.max_backoff,
                                                         s.backoff_multiplier,
                                                         s.attempt - s.resumes - s.recoveries, v_jitter)))
                          END,
           finished_at = CASE WHEN p_retryable
                                   AND s.attempt - s.resumes - s.recoveries < s.max_attempts
                              THEN NULL ELSE v_now END,
           lease_expires_at = NULL, waiting_for = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
    RETURNING s.status, s.attempt, s.action, s.available_at,
              s.concurrency_key, s.concurrency_limit INTO v_step;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                v_step.lease_token, v_step.attempt);
    END IF;
    INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, details,
                                     retryable, at)
    VALUES (p_run_id, p_node, v_step.attempt, 'handler', coalesce(p_type, ''),
            coalesce(p_message, ''), coalesce(p_details, ''), v_step.status = 'available',
            v_now);
    IF v_step.status = 'discarded' THEN
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], '{}', 1);
    END IF;
    -- A retry is ready (now or later); a discarded step frees a slot of its full
    -- concurrency key: either way the claims of its action look again.
    IF v_step.status = 'available'
       OR v_step.concurrency_key IS NOT NULL
          AND cyclone._key_wake(v_step.action, v_step.concurrency_key,
                                v_step.concurrency_limit, 1) IS NOT NULL THEN
        PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
    END IF;
    RETURN ROW(v_step.status, (SELECT r.status FROM cyclone.runs r WHERE r.run_id = p_run_id),
               false, v_step.available_at)::cyclone.completion;
END;
$$;

-- _step_fail_unheld, and while the run is blocked a retry is held like the run's other
-- ready steps: pending, released by Resolve together with them (at once: the backoff
-- is not kept across the block), and the answer says pending with no retry_at. While
-- the run is paused a retry is held too, pending until run_resume, its retry_at kept.
-- For a durable function, the failure that ended its body is not kept in its journal:
-- the node's last entry (greatest seq), when it is a safe call's failure, is deleted,
-- so that the next attempt calls it again. A failure the body handled and went on from
-- (a later entry exists) stays, and unsafe entries are never deleted here.
-- RPC: Complete with a failure; also called by step_complete_many.
CREATE FUNCTION cyclone.step_fail(
    p_run_id uuid, p_node text, p_lease_token uuid, p_type text, p_message text,
    p_details text, p_retryable boolean, p_retry_after interval)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- Generic plans, here and in the functions it calls (step_complete_many says why).
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    -- Takes the run lock, which holds until the caller's transaction ends.
    v_done cyclone.completion := cyclone._step_fail_unheld(
        p_run_id, p_node, p_lease_token, p_type, p_message, p_details, p_retryable,
        p_retry_after);
BEGIN
    IF v_done.step_status = 'available' AND v_done.run_status = 'blocked' THEN
        UPDATE cyclone.steps s SET status = 'pending', available_at = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'available';
        v_done.step_status := 'pending';
        v_done.retry_at := NULL;
    ELSIF v_done.step_status = 'available'
          AND (SELECT r.paused_at IS NOT NULL FROM cyclone.runs r WHERE r.run_id = p_run_id) THEN
        -- A paused run: held with the end of its backoff kept (run_resume).
        UPDATE cyclone.steps s SET status = 'pending'
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'available';
        v_done.step_status := 'pending';
    END IF;
    DELETE FROM cyclone.step_calls c
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.status = 'failed' AND NOT c.unsafe
       AND c.seq > ALL (SELECT o.seq FROM cyclone.step_calls o
                         WHERE o.run_id = p_run_id AND o.node = p_node
                           AND o.step_id <> c.step_id);
    RETURN v_done;
END;
$$;

-- The handler of an action its worker marks unsafe_to_repeat stopped without an
-- outcome (time limit, cancellation, shutdown): its effect may have happened. Like a
-- lost lease met by an unsafe claim, the step becomes uncertain and the run blocked
-- (EffectUncertain) at once, and the run's available steps are held (pending); in a run
-- already blocked on another step it is held (pending, effect_uncertain) and blocks
-- the run again when next claimed by a worker that marks it unsafe. The error joins
-- the step's history (kind handler, not retryable). CY001 when the lease is lost.
-- RPC: Complete with a failure that has effect_uncertain; also step_complete_many.
CREATE FUNCTION cyclone.step_abandon(p_run_id uuid, p_node text, p_lease_token uuid,
                                     p_type text, p_message text, p_details text)
RETURNS cyclone.completion
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
BEGIN
    UPDATE cyclone.steps s
       SET status = CASE WHEN v_status = 'running' THEN 'uncertain' ELSE 'pending' END,
           available_at = NULL, lease_expires_at = NULL, effect_uncertain = true,
           unsafe = true
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
    RETURNING s.status, s.attempt, s.action, s.started_at INTO v_step;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                    v_step.lease_token, v_step.attempt);
    END IF;
    INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, details,
                                     retryable, at)
    VALUES (p_run_id, p_node, v_step.attempt, 'handler', coalesce(p_type, ''),
            coalesce(p_message, ''), coalesce(p_details, ''), false, v_now);
    IF v_step.status = 'uncertain' THEN
        PERFORM cyclone._run_block(p_run_id, jsonb_build_object(
            'kind', 'EffectUncertain',
            'message', format(
                'node %s (action %s) stopped at attempt %s (started %s) without an '
                'outcome (%s); its effect may have happened. Check, then resolve: '
                'cyclone resolve %s %s --result JSON | --error MSG | --discard', p_node,
                v_step.action, v_step.attempt, cyclone._when(v_step.started_at),
                left(concat_ws(': ', nullif(p_type, ''), nullif(p_message, '')), 200),
                p_run_id, p_node),
            'node', p_node, 'attempt', v_step.attempt,
            'started_at', v_step.started_at), v_now);
        v_status := 'blocked';
    END IF;
    RETURN ROW(v_step.status, v_status, false, NULL)::cyclone.completion;
END;
$$;
