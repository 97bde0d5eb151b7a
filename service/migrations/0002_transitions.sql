-- Cyclone transitions, version 1. Every transition is one function that locks what it
-- changes and guards each row by its from-state; nothing is decided in the caller.
--
-- Lock order, to stay free of deadlocks: a function that changes more than one row
-- locks the run row first (FOR NO KEY UPDATE), then steps. step_claim and sweep meet
-- step rows first: they take run locks only with SKIP LOCKED, so they never wait
-- while holding a step.
--
-- Errors carry SQLSTATEs of their own, which every SDK maps to one exception:
--   CY001 lease lost     (gRPC ABORTED)
--   CY002 not found      (gRPC NOT_FOUND)
--   CY003 wrong state    (gRPC FAILED_PRECONDITION)

-- Locks a run row and returns its status; CY002 when there is no such run.
CREATE FUNCTION cyclone._run_lock(p_run_id uuid) RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_status text;
BEGIN
    SELECT status INTO v_status FROM cyclone.runs WHERE run_id = p_run_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'CY002';
    END IF;
    RETURN v_status;
END;
$$;

-- Wakes the claims waiting for these actions (delivered at commit).
CREATE FUNCTION cyclone._notify_ready(p_actions text[]) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify('cyclone_ready', a) FROM (SELECT DISTINCT unnest(p_actions) AS a) t
$$;

-- Propagates steps that just became final to their dependents: a dependent whose
-- upstream is all final runs if its trigger rule is met and is skipped otherwise (and
-- a skip propagates in turn). Ready steps become available, or stay pending (held)
-- while the run is blocked. Closes the run when no step is open.
--   p_final:  nodes that just became final
--   p_decide: pending nodes to judge now (used by retry)
--   p_closed: how many steps the caller made final itself
-- The caller holds the run row lock.
CREATE FUNCTION cyclone._settle(p_run_id uuid, p_final text[], p_decide text[], p_closed integer)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now        timestamptz := cyclone.now();
    v_queue      text[] := p_final;
    v_decide     text[] := p_decide;
    v_ready      text[] := '{}';
    v_closed     integer := p_closed;
    v_dependents text[];
    v_failed     boolean;
    v_step       record;
    v_run        record;
BEGIN
    LOOP
        -- Judge the pending steps whose upstream is all final.
        FOR v_step IN
            SELECT node, trigger_rule, deps_failed FROM cyclone.steps
             WHERE run_id = p_run_id AND node = ANY (v_decide)
               AND status = 'pending' AND deps_open = 0
        LOOP
            IF (CASE v_step.trigger_rule
                    WHEN 'all_success' THEN v_step.deps_failed = 0
                    WHEN 'all_done' THEN true
                    ELSE v_step.deps_failed > 0
                END)
            THEN
                v_ready := v_ready || v_step.node;
            ELSE
                UPDATE cyclone.steps SET status = 'skipped', finished_at = v_now
                 WHERE run_id = p_run_id AND node = v_step.node AND status = 'pending';
                v_queue := v_queue || v_step.node;
                v_closed := v_closed + 1;
            END IF;
        END LOOP;
        EXIT WHEN cardinality(v_queue) = 0;

        -- Take one final step off the queue and count it at each pending dependent.
        SELECT dependents, status <> 'completed' INTO v_dependents, v_failed
          FROM cyclone.steps WHERE run_id = p_run_id AND node = v_queue[1];
        v_queue := v_queue[2:];
        WITH counted AS (
            UPDATE cyclone.steps
               SET deps_open = deps_open - 1, deps_failed = deps_failed + v_failed::integer
             WHERE run_id = p_run_id AND node = ANY (v_dependents) AND status = 'pending'
            RETURNING node, deps_open
        )
        SELECT coalesce(array_agg(node), '{}') INTO v_decide FROM counted WHERE deps_open = 0;
    END LOOP;

    SELECT status, steps_open INTO v_run FROM cyclone.runs WHERE run_id = p_run_id;
    IF cardinality(v_ready) > 0 AND v_run.status = 'running' THEN
        WITH released AS (
            UPDATE cyclone.steps SET status = 'available', available_at = v_now
             WHERE run_id = p_run_id AND node = ANY (v_ready) AND status = 'pending'
            RETURNING action)
        SELECT array_agg(action) INTO v_ready FROM released;
        PERFORM cyclone._notify_ready(v_ready);
    END IF;
    IF v_closed = 0 THEN
        RETURN;
    END IF;
    IF v_run.steps_open > v_closed OR v_run.status <> 'running' THEN
        UPDATE cyclone.runs SET steps_open = steps_open - v_closed, updated_at = v_now
         WHERE run_id = p_run_id;
        RETURN;
    END IF;
    -- The last open step closed: the run is completed, or failed by its first discard.
    SELECT node, attempt, started_at INTO v_step FROM cyclone.steps
     WHERE run_id = p_run_id AND status = 'discarded' ORDER BY finished_at, node LIMIT 1;
    UPDATE cyclone.runs
       SET steps_open = 0, updated_at = v_now, finished_at = v_now,
           status = CASE WHEN v_step.node IS NULL THEN 'completed' ELSE 'failed' END,
           error = CASE WHEN v_step.node IS NULL THEN NULL ELSE jsonb_build_object(
                       'kind', 'StepDiscarded',
                       'message', format('node %s was discarded at attempt %s',
                                         v_step.node, v_step.attempt),
                       'node', v_step.node, 'attempt', v_step.attempt,
                       'started_at', v_step.started_at) END
     WHERE run_id = p_run_id;
END;
$$;

-- Creates a run and all its steps; root steps become available. With a submit key,
-- at most one run exists per (workflow, key): a repeated call returns that run with
-- created = false. p_nodes is a JSON array of node objects in topological order
-- (see service/store.py).
CREATE FUNCTION cyclone.run_submit(
    p_run_id uuid, p_workflow text, p_submit_key text, p_input jsonb, p_nodes jsonb,
    OUT run_id uuid, OUT created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    v_count integer := jsonb_array_length(p_nodes);
BEGIN
    INSERT INTO cyclone.runs AS r (run_id, workflow, submit_key, status, input, steps_total,
                                   steps_open, created_at, updated_at)
    VALUES (p_run_id, p_workflow, p_submit_key, 'running', p_input, v_count, v_count,
            v_now, v_now)
    ON CONFLICT (workflow, submit_key) DO NOTHING;
    IF NOT FOUND THEN
        SELECT r.run_id INTO run_id FROM cyclone.runs r
         WHERE r.workflow = p_workflow AND r.submit_key = p_submit_key;
        created := false;
        RETURN;
    END IF;

    INSERT INTO cyclone.steps (run_id, node, position, action, status, trigger_rule, depends_on,
                               dependents, deps_open, max_attempts, initial_backoff,
                               max_backoff, backoff_multiplier, timeout, input, available_at)
    SELECT p_run_id, n.name, n.position, n.action,
           CASE WHEN cardinality(n.depends_on) = 0 THEN 'available' ELSE 'pending' END,
           n.trigger_rule, n.depends_on, n.dependents, cardinality(n.depends_on),
           n.max_attempts, make_interval(secs => n.initial_backoff_s),
           make_interval(secs => n.max_backoff_s), n.backoff_multiplier,
           make_interval(secs => n.timeout_s), n.input,
           CASE WHEN cardinality(n.depends_on) = 0 THEN v_now END
      FROM jsonb_to_recordset(p_nodes) AS n(
               name text, position integer, action text, depends_on text[], dependents text[],
               trigger_rule text, max_attempts integer, initial_backoff_s float8,
               max_backoff_s float8, backoff_multiplier float8, timeout_s float8, input jsonb);

    PERFORM cyclone._notify_ready(array_agg(e.node->>'action'))
       FROM jsonb_array_elements(p_nodes) e(node)
      WHERE jsonb_array_length(e.node->'depends_on') = 0;
    run_id := p_run_id;
    created := true;
END;
$$;

-- Claims up to p_limit ready steps of p_actions for p_worker, oldest first, in one
-- statement with FOR UPDATE SKIP LOCKED: attempt + 1, a fresh random lease token, a
-- lease of p_lease capped by the node's timeout. Before that, a ready step whose last
-- lease expired with no outcome, of an action this worker marks unsafe (p_unsafe), is
-- not handed out: it becomes uncertain and its run blocked (returned with blocked =
-- true so the caller can log it).
CREATE FUNCTION cyclone.step_claim(
    p_worker text, p_actions text[], p_unsafe text[], p_limit integer, p_lease interval)
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    IF cardinality(p_unsafe) > 0 THEN
        RETURN QUERY SELECT b.run_id, b.node, b.action, b.workflow, b.attempt, b.max_attempts,
                            NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::uuid,
                            NULL::timestamptz, NULL::timestamptz, NULL::jsonb, true, true
                       FROM cyclone._block_uncertain(p_unsafe) b;
    END IF;

    RETURN QUERY
    WITH picked AS (
        SELECT c.run_id, c.node, c.effect_uncertain
          FROM unnest(p_actions) AS a(action)
         CROSS JOIN LATERAL (
               SELECT s.run_id, s.node, s.available_at, s.effect_uncertain
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
               deadline_at = v_now + s.timeout,
               lease_expires_at = v_now + least(p_lease, s.timeout),
               worker_id = p_worker,
               unsafe = s.action = ANY (p_unsafe),
               effect_uncertain = false
          FROM picked p
         WHERE s.run_id = p.run_id AND s.node = p.node
        RETURNING s.run_id, s.node, s.action, s.attempt, s.max_attempts, s.input,
                  s.depends_on, s.lease_token, s.lease_expires_at, s.deadline_at,
                  s.progress, p.effect_uncertain
    )
    SELECT c.run_id, c.node, c.action, r.workflow, c.attempt, c.max_attempts, c.input,
           r.input,
           CASE WHEN cardinality(c.depends_on) > 0 THEN (
               SELECT jsonb_object_agg(u.node, u.output) FROM cyclone.steps u
                WHERE u.run_id = c.run_id AND u.node = ANY (c.depends_on)
                  AND u.status = 'completed') END,
           c.lease_token, c.lease_expires_at, c.deadline_at, c.progress,
           c.effect_uncertain, false
      FROM claimed c JOIN cyclone.runs r ON r.run_id = c.run_id;
END;
$$;

-- Blocks the runs whose ready, uncertain step is of an action in p_unsafe: the step
-- becomes uncertain, the run blocked with an EffectUncertain error, and the run's
-- other ready steps are held (pending) until Resolve. Rows are taken with SKIP
-- LOCKED; a step whose run is locked is left for the next claim.
CREATE FUNCTION cyclone._block_uncertain(p_unsafe text[])
RETURNS TABLE (run_id uuid, node text, action text, workflow text, attempt integer,
               max_attempts integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := cyclone.now();
    v_step record;
BEGIN
    FOR v_step IN
        SELECT s.run_id, s.node, s.action, s.attempt, s.max_attempts, s.started_at
          FROM cyclone.steps s
         WHERE s.status = 'available' AND s.effect_uncertain AND s.action = ANY (p_unsafe)
           FOR UPDATE SKIP LOCKED
    LOOP
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM cyclone.runs r
             WHERE r.run_id = v_step.run_id AND r.status = 'running'
               FOR NO KEY UPDATE SKIP LOCKED);
        UPDATE cyclone.steps s SET status = 'uncertain'
         WHERE s.run_id = v_step.run_id AND s.node = v_step.node;
        UPDATE cyclone.steps s SET status = 'pending', available_at = NULL
         WHERE s.run_id = v_step.run_id AND s.status = 'available';
        UPDATE cyclone.runs r
           SET status = 'blocked', updated_at = v_now,
               error = jsonb_build_object(
                   'kind', 'EffectUncertain',
                   'message', format(
                       'node %s (action %s) lost its lease at attempt %s, started %s, with no '
                       'outcome; its effect may have happened. Check, then Resolve with '
                       'result, error or discard', v_step.node, v_step.action,
                       v_step.attempt, v_step.started_at),
                   'node', v_step.node, 'attempt', v_step.attempt,
                   'started_at', v_step.started_at)
         WHERE r.run_id = v_step.run_id
        RETURNING r.workflow INTO workflow;
        run_id := v_step.run_id;
        node := v_step.node;
        action := v_step.action;
        attempt := v_step.attempt;
        max_attempts := v_step.max_attempts;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Extends a held lease to now + p_lease, never past the node's deadline, and keeps
-- the progress value when one is given. Returns the new expiry, or cancelled = true
-- when the run was cancelled under the lease. CY001 when the lease is lost.
CREATE FUNCTION cyclone.step_heartbeat(
    p_run_id uuid, p_node text, p_lease_token uuid, p_lease interval, p_progress jsonb,
    OUT lease_expires_at timestamptz, OUT cancelled boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := cyclone.now();
    v_step record;
BEGIN
    UPDATE cyclone.steps s
       SET lease_expires_at = least(v_now + p_lease, s.deadline_at),
           progress = coalesce(p_progress, s.progress)
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'running'
       AND s.lease_token = p_lease_token AND s.lease_expires_at > v_now
    RETURNING s.lease_expires_at INTO lease_expires_at;
    IF FOUND THEN
        cancelled := false;
        RETURN;
    END IF;
    SELECT s.status, s.lease_token, s.attempt INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
    IF v_step.status = 'cancelled' AND v_step.lease_token = p_lease_token THEN
        cancelled := true;
        RETURN;
    END IF;
    PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                v_step.lease_token, v_step.attempt);
END;
$$;

-- Raises the error that explains why p_lease_token no longer holds (p_run_id, p_node),
-- given the step's current status, lease token and attempt (all NULL: no such step).
CREATE FUNCTION cyclone._lease_lost(
    p_run_id uuid, p_node text, p_lease_token uuid, p_status text, p_holder uuid,
    p_attempt integer)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_status IS NULL THEN
        RAISE EXCEPTION 'step (%, %) not found', p_run_id, p_node USING ERRCODE = 'CY002';
    END IF;
    IF p_holder = p_lease_token THEN
        RAISE EXCEPTION 'lease lost: the lease of (%, %) attempt % is no longer valid (step is %)',
            p_run_id, p_node, p_attempt, p_status
            USING ERRCODE = 'CY001', DETAIL = format('current_attempt=%s', p_attempt);
    END IF;
    RAISE EXCEPTION 'lease lost: this token does not hold (%, %), which is now at attempt % (%)',
        p_run_id, p_node, p_attempt, p_status
        USING ERRCODE = 'CY001', DETAIL = format('current_attempt=%s', p_attempt);
END;
$$;

-- The completion transaction's last statement: marks a held step completed with its
-- output, releases its dependents and completes the run when nothing is left. A
-- worker may call it inside its own transaction, after its business writes: when the
-- lease is lost it raises CY001 and the whole transaction, business writes included,
-- rolls back. Repeating it with the token of the completed attempt returns the
-- recorded result with duplicate = true.
CREATE FUNCTION cyclone.step_complete(
    p_run_id uuid, p_node text, p_lease_token uuid, p_output jsonb)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
BEGIN
    UPDATE cyclone.steps s
       SET status = 'completed', output = coalesce(p_output, 'null'::jsonb),
           finished_at = v_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'running'
       AND s.lease_token = p_lease_token AND s.lease_expires_at > v_now;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        IF v_step.status = 'completed' AND v_step.lease_token = p_lease_token THEN
            RETURN ROW('completed', v_status, true, NULL)::cyclone.completion;
        END IF;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                v_step.lease_token, v_step.attempt);
    END IF;
    PERFORM cyclone._settle(p_run_id, ARRAY[p_node], '{}', 1);
    RETURN ROW('completed', (SELECT r.status FROM cyclone.runs r WHERE r.run_id = p_run_id),
               false, NULL)::cyclone.completion;
END;
$$;

-- Records a failed attempt of a held step. A retryable failure with attempts left
-- makes the step available again after p_retry_after, or else after the node's
-- exponential backoff less a random jitter of up to half; otherwise the step is
-- discarded and its dependents judged. CY001 when the lease is lost.
CREATE FUNCTION cyclone.step_fail(
    p_run_id uuid, p_node text, p_lease_token uuid, p_type text, p_message text,
    p_details text, p_retryable boolean, p_retry_after interval)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
BEGIN
    UPDATE cyclone.steps s
       SET status = CASE WHEN p_retryable AND s.attempt < s.max_attempts
                         THEN 'available' ELSE 'discarded' END,
           available_at = CASE WHEN p_retryable AND s.attempt < s.max_attempts
                               THEN v_now + coalesce(p_retry_after,
                                                     cyclone._backoff(s.initial_backoff, s.max_backoff,
                                                                      s.backoff_multiplier, s.attempt))
                          END,
           finished_at = CASE WHEN p_retryable AND s.attempt < s.max_attempts THEN NULL
                              ELSE v_now END,
           lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'running'
       AND s.lease_token = p_lease_token AND s.lease_expires_at > v_now
    RETURNING s.status, s.attempt, s.action, s.available_at INTO v_step;
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
    ELSE
        PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
    END IF;
    RETURN ROW(v_step.status, (SELECT r.status FROM cyclone.runs r WHERE r.run_id = p_run_id),
               false, v_step.available_at)::cyclone.completion;
END;
$$;

-- Exponential backoff before the attempt after p_attempt, less up to half as jitter.
CREATE FUNCTION cyclone._backoff(
    p_initial interval, p_max interval, p_multiplier float8, p_attempt integer)
RETURNS interval
LANGUAGE sql VOLATILE AS $$
    SELECT d * (1 - random() / 2)
      FROM (SELECT least(p_max, p_initial * power(p_multiplier, least(p_attempt - 1, 60)))) b(d)
$$;

-- The recovery sweep: steps whose lease expired become available again, remembered
-- as effect_uncertain, or are discarded when out of attempts (unless the worker that
-- held them marked the action unsafe: then the next claim decides). Blocked runs are
-- left alone. Safe with any number of sweepers: run rows are taken with SKIP LOCKED
-- and each step is guarded by its lease. Returns how many steps it reclaimed.
CREATE FUNCTION cyclone.sweep(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    v_count integer := 0;
    v_cand  record;
    v_step  record;
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
           SET status = CASE WHEN s.attempt >= s.max_attempts AND NOT s.unsafe
                             THEN 'discarded' ELSE 'available' END,
               available_at = CASE WHEN s.attempt >= s.max_attempts AND NOT s.unsafe
                                   THEN NULL ELSE v_now END,
               finished_at = CASE WHEN s.attempt >= s.max_attempts AND NOT s.unsafe
                                  THEN v_now END,
               effect_uncertain = true,
               lease_expires_at = NULL
         WHERE s.run_id = v_cand.run_id AND s.node = v_cand.node AND s.status = 'running'
           AND s.lease_token = v_cand.lease_token AND s.lease_expires_at <= v_now
        RETURNING s.status, s.attempt, s.action, s.worker_id INTO v_step;
        CONTINUE WHEN NOT FOUND;
        v_count := v_count + 1;
        INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
        VALUES (v_cand.run_id, v_cand.node, v_step.attempt, 'lease_expired', 'LeaseExpired',
                format('lease of worker %s expired with no outcome', v_step.worker_id),
                v_step.status = 'available', v_now);
        IF v_step.status = 'discarded' THEN
            PERFORM cyclone._settle(v_cand.run_id, ARRAY[v_cand.node], '{}', 1);
        ELSE
            PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
        END IF;
    END LOOP;
    RETURN v_count;
END;
$$;

-- Reopens discarded nodes in place (all of them when p_nodes is NULL): same run_id
-- and node; the next claim increments attempt. Steps skipped because of them go back
-- to pending, and the run back to running. Returns the reopened nodes. CY003 when a
-- node is not discarded, or the run is blocked or cancelled.
CREATE FUNCTION cyclone.step_retry(p_run_id uuid, p_nodes text[], p_actor text, p_reason text)
RETURNS text[]
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := cyclone.now();
    v_status   text := cyclone._run_lock(p_run_id);
    v_nodes    text[];
    v_bad      record;
    v_reopened text[];
BEGIN
    IF v_status IN ('blocked', 'cancelled') THEN
        RAISE EXCEPTION 'run % is %: only a running or failed run can be retried',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    IF p_nodes IS NULL THEN
        v_nodes := ARRAY(SELECT s.node FROM cyclone.steps s
                          WHERE s.run_id = p_run_id AND s.status = 'discarded' ORDER BY s.node);
        IF cardinality(v_nodes) = 0 THEN
            RAISE EXCEPTION 'run % has no discarded node to retry', p_run_id
                USING ERRCODE = 'CY003';
        END IF;
    ELSE
        v_nodes := p_nodes;
        SELECT n.node, s.status INTO v_bad
          FROM unnest(p_nodes) n(node)
          LEFT JOIN cyclone.steps s ON s.run_id = p_run_id AND s.node = n.node
         WHERE s.status IS DISTINCT FROM 'discarded' LIMIT 1;
        IF FOUND AND v_bad.status IS NULL THEN
            RAISE EXCEPTION 'run % has no node %', p_run_id, v_bad.node USING ERRCODE = 'CY002';
        ELSIF FOUND THEN
            RAISE EXCEPTION 'node % is %, not discarded: only a discarded node can be retried',
                v_bad.node, v_bad.status USING ERRCODE = 'CY003';
        END IF;
    END IF;

    UPDATE cyclone.steps s
       SET status = 'available', available_at = v_now, finished_at = NULL,
           lease_expires_at = NULL, effect_uncertain = false
     WHERE s.run_id = p_run_id AND s.node = ANY (v_nodes) AND s.status = 'discarded';

    -- Reopen what was skipped downstream of them, then recount every open dependent.
    WITH RECURSIVE down(node) AS (
        SELECT unnest(s.dependents) FROM cyclone.steps s
         WHERE s.run_id = p_run_id AND s.node = ANY (v_nodes)
        UNION
        SELECT unnest(s.dependents) FROM cyclone.steps s JOIN down d ON s.node = d.node
         WHERE s.run_id = p_run_id AND s.status = 'skipped'
    ), reopened AS (
        UPDATE cyclone.steps s SET status = 'pending', finished_at = NULL
          FROM down d
         WHERE s.run_id = p_run_id AND s.node = d.node AND s.status = 'skipped'
        RETURNING s.node
    )
    SELECT array_agg(DISTINCT d.node) INTO v_reopened FROM down d;

    UPDATE cyclone.steps s
       SET deps_open = c.open, deps_failed = c.failed
      FROM (SELECT t.node,
                   count(*) FILTER (WHERE u.status NOT IN ('completed', 'discarded', 'skipped',
                                                           'cancelled')) AS open,
                   count(*) FILTER (WHERE u.status IN ('discarded', 'skipped')) AS failed
              FROM cyclone.steps t JOIN cyclone.steps u
                ON u.run_id = t.run_id AND u.node = ANY (t.depends_on)
             WHERE t.run_id = p_run_id AND t.node = ANY (coalesce(v_reopened, '{}'))
               AND t.status = 'pending'
             GROUP BY t.node) c
     WHERE s.run_id = p_run_id AND s.node = c.node;

    UPDATE cyclone.runs r
       SET status = 'running', error = NULL, finished_at = NULL, updated_at = v_now,
           steps_open = (SELECT count(*) FROM cyclone.steps s
                          WHERE s.run_id = p_run_id
                            AND s.status NOT IN ('completed', 'discarded', 'skipped', 'cancelled'))
     WHERE r.run_id = p_run_id;
    PERFORM cyclone._notify_ready(ARRAY(
        SELECT s.action FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = ANY (v_nodes)));
    PERFORM cyclone._settle(p_run_id, '{}', coalesce(v_reopened, '{}'), 0);
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, CASE WHEN p_nodes IS NULL THEN '' ELSE p_nodes[1] END,
            CASE WHEN p_nodes IS NULL THEN 'retry_all' ELSE 'retry' END, p_actor,
            coalesce(p_reason, ''), jsonb_build_object('nodes', to_jsonb(v_nodes)), v_now);
    RETURN v_nodes;
END;
$$;

-- Resolves the uncertain step of a blocked run: 'result' (the effect happened; p_value
-- becomes the output), 'error' (the effect happened and failed; the step is discarded
-- so failure-rule nodes run) or 'discard' (the effect did not happen; the step runs on
-- the next claim). The run goes back to running and its held steps are released.
-- CY003 when the run is not blocked or the node is not its uncertain step.
CREATE FUNCTION cyclone.step_resolve(
    p_run_id uuid, p_node text, p_choice text, p_value jsonb, p_actor text, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
    v_held   text[];
BEGIN
    IF v_status <> 'blocked' THEN
        RAISE EXCEPTION 'run % is %, not blocked: only a blocked run can be resolved',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    SELECT s.status, s.attempt, s.action INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % has no node %', p_run_id, p_node USING ERRCODE = 'CY002';
    END IF;
    IF v_step.status <> 'uncertain' THEN
        RAISE EXCEPTION 'node % is %, not uncertain: only the uncertain step of a blocked run '
                        'can be resolved (here: %)', p_node, v_step.status,
            (SELECT string_agg(s.node, ', ') FROM cyclone.steps s
              WHERE s.run_id = p_run_id AND s.status = 'uncertain')
            USING ERRCODE = 'CY003';
    END IF;

    UPDATE cyclone.runs SET status = 'running', error = NULL, updated_at = v_now
     WHERE run_id = p_run_id;
    -- Release what was held while blocked.
    v_held := ARRAY(SELECT s.node FROM cyclone.steps s
                     WHERE s.run_id = p_run_id AND s.status = 'pending' AND s.deps_open = 0);
    CASE p_choice
    WHEN 'result' THEN
        UPDATE cyclone.steps s
           SET status = 'completed', output = coalesce(p_value, 'null'::jsonb),
               finished_at = v_now, effect_uncertain = false
         WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], v_held, 1);
    WHEN 'error' THEN
        UPDATE cyclone.steps s
           SET status = 'discarded', finished_at = v_now, effect_uncertain = false
         WHERE s.run_id = p_run_id AND s.node = p_node;
        INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
        VALUES (p_run_id, p_node, v_step.attempt, 'resolved', 'EffectFailed',
                p_value #>> '{}', false, v_now);
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], v_held, 1);
    WHEN 'discard' THEN
        UPDATE cyclone.steps s
           SET status = 'available', available_at = v_now, effect_uncertain = false
         WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
        PERFORM cyclone._settle(p_run_id, '{}', v_held, 0);
    ELSE
        RAISE EXCEPTION 'unknown resolution %', p_choice USING ERRCODE = 'CY004';
    END CASE;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, p_node, 'resolve_' || p_choice, p_actor, coalesce(p_reason, ''),
            jsonb_build_object('attempt', v_step.attempt, 'value', p_value), v_now);
END;
$$;

-- Cancels a run: every unfinished step becomes cancelled (a running handler learns it
-- from its next heartbeat and its completion is refused). CY003 when the run is
-- already completed or cancelled.
CREATE FUNCTION cyclone.run_cancel(p_run_id uuid, p_actor text, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
BEGIN
    IF v_status IN ('completed', 'cancelled') THEN
        RAISE EXCEPTION 'run % is already %', p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    UPDATE cyclone.steps s SET status = 'cancelled', finished_at = v_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.status IN ('pending', 'available', 'running', 'uncertain');
    UPDATE cyclone.runs
       SET status = 'cancelled', steps_open = 0, error = NULL, finished_at = v_now,
           updated_at = v_now
     WHERE run_id = p_run_id;
    INSERT INTO cyclone.audit (run_id, action, actor, reason, details, at)
    VALUES (p_run_id, 'cancel', p_actor, coalesce(p_reason, ''),
            jsonb_build_object('previous_status', v_status), v_now);
END;
$$;
