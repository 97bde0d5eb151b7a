-- Lease checks by key (performance): every lookup of one held step by its key writes
-- its lease check as CASE WHEN status = 'running' THEN lease_expires_at > now END.
-- Written plainly, a planner whose statistics saw few running steps walked
-- steps_leased_idx (every running step) for each lookup instead of the primary key:
-- in the durable bench, 93 heap fetches per step call. Functions re-created:
--   cyclone.step_heartbeat, cyclone._step_complete, cyclone.step_complete_many, cyclone._step_held, cyclone.step_calls_end_many, cyclone.step_calls_begin_many, cyclone._step_fail_unheld, cyclone.step_abandon

CREATE OR REPLACE FUNCTION cyclone.step_heartbeat(
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
           last_heartbeat_at = v_now,
           progress = coalesce(p_progress, s.progress)
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
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

CREATE OR REPLACE FUNCTION cyclone._step_complete(p_run_id uuid, p_node text, p_lease_token uuid,
                                       p_output jsonb)
RETURNS cyclone.completion
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now        timestamptz := cyclone.now();
    v_status     text := cyclone._run_lock(p_run_id);
    v_dependents text[];
    v_step       record;
BEGIN
    UPDATE cyclone.steps s
       SET status = 'completed', output = coalesce(p_output, 'null'::jsonb),
           finished_at = v_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
    RETURNING s.dependents INTO v_dependents;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        IF v_step.status = 'completed' AND v_step.lease_token = p_lease_token THEN
            RETURN ROW('completed', v_status, true, NULL)::cyclone.completion;
        END IF;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                    v_step.lease_token, v_step.attempt);
    END IF;
    IF cardinality(v_dependents) = 0 THEN
        v_status := cyclone._run_close(p_run_id, 1, v_now);
    ELSE
        v_status := cyclone._settle(p_run_id, ARRAY[p_node], '{}', 1);
    END IF;
    RETURN ROW('completed', v_status, false, NULL)::cyclone.completion;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone.step_complete_many(p_items jsonb)
RETURNS TABLE (i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, error_state text, error_message text,
               error_detail text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := cyclone.now();
    v_applied  integer[];
    v_run      uuid[];
    v_node     text[];
    v_has_deps boolean[];
    v_statuses jsonb;
    v_group    record;
    v_item     jsonb;
    v_done     cyclone.completion;
BEGIN
    -- Lock every run of the batch in run_id order, the order every batch locks in, so
    -- that two batches cannot deadlock.
    PERFORM 1 FROM cyclone.runs r
     WHERE r.run_id = ANY (ARRAY(SELECT DISTINCT (e->>'run_id')::uuid
                                   FROM jsonb_array_elements(p_items) e))
     ORDER BY r.run_id
       FOR NO KEY UPDATE;

    -- Every success whose lease still holds, in one statement (as step_complete).
    WITH item AS (
        SELECT (e->>'i')::integer AS i, (e->>'run_id')::uuid AS run_id, e->>'node' AS node,
               (e->>'lease_token')::uuid AS lease_token, e->'output' AS output
          FROM jsonb_array_elements(p_items) e
         WHERE NOT e ? 'failure'
    ), done AS (
        UPDATE cyclone.steps s
           SET status = 'completed', output = coalesce(t.output, 'null'::jsonb),
               finished_at = v_now, lease_expires_at = NULL
          FROM item t
         WHERE s.run_id = t.run_id AND s.node = t.node AND s.lease_token = t.lease_token
           -- By key: see steps_leased_idx.
           AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
        RETURNING t.i, s.run_id, s.node, cardinality(s.dependents) > 0 AS has_deps
    )
    SELECT coalesce(array_agg(i), '{}'), coalesce(array_agg(run_id), '{}'),
           coalesce(array_agg(node), '{}'), coalesce(array_agg(has_deps), '{}')
      INTO v_applied, v_run, v_node, v_has_deps
      FROM done;

    -- Runs where no completed step has a dependent: close them by the count, at once.
    SELECT coalesce(jsonb_object_agg(c.run_id, c.status), '{}') INTO v_statuses
      FROM (SELECT array_agg(g.run_id ORDER BY g.run_id) AS runs,
                   array_agg(g.n ORDER BY g.run_id) AS closed
              FROM (SELECT d.run_id, count(*)::integer AS n
                      FROM unnest(v_run, v_has_deps) d(run_id, has_deps)
                     GROUP BY d.run_id HAVING NOT bool_or(d.has_deps)) g) leaves,
           cyclone._runs_close(leaves.runs, leaves.closed, v_now) c;

    -- Runs with dependents to count: one graph walk per run, with all its finals.
    FOR v_group IN
        SELECT d.run_id, array_agg(d.node) AS nodes
          FROM unnest(v_run, v_node, v_has_deps) d(run_id, node, has_deps)
         GROUP BY d.run_id HAVING bool_or(d.has_deps)
         ORDER BY d.run_id
    LOOP
        v_statuses := v_statuses || jsonb_build_object(
            v_group.run_id::text,
            cyclone._settle(v_group.run_id, v_group.nodes, '{}', cardinality(v_group.nodes)));
    END LOOP;

    RETURN QUERY
        SELECT d.i, 'completed'::text, v_statuses->>(d.run_id::text), false,
               NULL::timestamptz, NULL::text, NULL::text, NULL::text
          FROM unnest(v_applied, v_run) d(i, run_id);

    -- The rest one at a time, each in its own subtransaction so that a refusal stands
    -- alone: failures, and successes the pass above did not apply (a lost lease, a
    -- repeated completion, an unknown step), which _step_complete then explains.
    FOR v_item IN
        SELECT e FROM jsonb_array_elements(p_items) e
         WHERE NOT (e->>'i')::integer = ANY (v_applied)
         ORDER BY e->>'run_id', e->>'node', (e->>'i')::integer
    LOOP
        i := (v_item->>'i')::integer;
        BEGIN
            IF (v_item->'failure'->>'uncertain')::boolean THEN
                v_done := cyclone.step_abandon(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'failure'->>'type', v_item->'failure'->>'message',
                    v_item->'failure'->>'details');
            ELSIF v_item ? 'failure' THEN
                v_done := cyclone.step_fail(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'failure'->>'type', v_item->'failure'->>'message',
                    v_item->'failure'->>'details', (v_item->'failure'->>'retryable')::boolean,
                    make_interval(secs => (v_item->'failure'->>'retry_after_s')::float8));
            ELSE
                v_done := cyclone._step_complete(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'output');
            END IF;
            step_status := v_done.step_status;
            run_status := v_done.run_status;
            duplicate := v_done.duplicate;
            retry_at := v_done.retry_at;
            error_state := NULL;
            error_message := NULL;
            error_detail := NULL;
        EXCEPTION WHEN SQLSTATE 'CY001' OR SQLSTATE 'CY002' OR SQLSTATE 'CY003' THEN
            GET STACKED DIAGNOSTICS error_state = RETURNED_SQLSTATE,
                                    error_message = MESSAGE_TEXT,
                                    error_detail = PG_EXCEPTION_DETAIL;
            step_status := NULL;
            run_status := NULL;
            duplicate := NULL;
            retry_at := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone._step_held(p_run_id uuid, p_node text, p_lease_token uuid,
                                   p_lock boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_step record;
BEGIN
    IF p_lock THEN
        SELECT s.attempt INTO v_step FROM cyclone.steps s
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
           -- By key: see steps_leased_idx.
           AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > cyclone.now() END
           FOR SHARE;
    ELSE
        SELECT s.attempt INTO v_step FROM cyclone.steps s
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
           -- By key: see steps_leased_idx.
           AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > cyclone.now() END;
    END IF;
    IF FOUND THEN
        RETURN v_step.attempt;
    END IF;
    SELECT s.status, s.lease_token, s.attempt INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
    PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                v_step.lease_token, v_step.attempt);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone.step_calls_end_many(p_items jsonb, p_brief boolean DEFAULT false)
RETURNS TABLE (i integer, duplicate boolean, call jsonb, error_state text,
               error_message text, error_detail text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    v_added integer[];
    v_calls jsonb[];
    v_index jsonb;
    v_item  jsonb;
    v_end   record;
BEGIN
    PERFORM 1 FROM cyclone.runs r
     WHERE r.run_id = ANY (ARRAY(SELECT DISTINCT (e->>'run_id')::uuid
                                   FROM jsonb_array_elements(p_items) e))
     ORDER BY r.run_id
       FOR NO KEY UPDATE;

    -- Where each item is, by its key: the first item of a key wins (a repeat within
    -- the batch is then answered by the pass one at a time).
    SELECT jsonb_object_agg((e->>'run_id') || '/' || (e->>'node') || '/' || (e->>'step_id'),
                            (e->>'i')::integer ORDER BY (e->>'i')::integer DESC)
      INTO v_index
      FROM jsonb_array_elements(p_items) e;

    -- Each held node of the batch once (its lease checked and its row share-locked by
    -- key), with room for its items; then its STARTED entries ended in place and its
    -- new entries added, each mapped back to its item by key.
    WITH item AS MATERIALIZED (
        SELECT (e->>'run_id')::uuid AS run_id, e->>'node' AS node,
               (e->>'lease_token')::uuid AS lease_token, e->>'step_id' AS step_id,
               (e->>'seq')::integer AS seq, e->>'function' AS function,
               coalesce((e->>'unsafe')::boolean, false) AS unsafe, e->'output' AS output,
               e->'error' AS error
          FROM jsonb_array_elements(p_items) e
         WHERE (e->'output' IS NULL) <> (e->'error' IS NULL)
    ), held AS (
        SELECT k.run_id, k.node, k.lease_token, s.attempt
          FROM (SELECT t.run_id, t.node, t.lease_token, count(*) AS n
                  FROM item t GROUP BY t.run_id, t.node, t.lease_token) k
         CROSS JOIN LATERAL (
               SELECT s.attempt FROM cyclone.steps s
                WHERE s.run_id = k.run_id AND s.node = k.node AND s.lease_token = k.lease_token
                  -- By key: see steps_leased_idx.
                  AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
                  FOR SHARE) s
         WHERE k.n + (SELECT count(*) FROM (SELECT 1 FROM cyclone.step_calls c
                                             WHERE c.run_id = k.run_id AND c.node = k.node
                                             LIMIT 10000) x) <= 10000
    ), ended AS (
        UPDATE cyclone.step_calls AS c
           SET status = CASE WHEN t.error IS NULL THEN 'succeeded' ELSE 'failed' END,
               output = t.output, error = t.error, attempt = h.attempt, finished_at = v_now
          FROM item t
          JOIN held h
            ON h.run_id = t.run_id AND h.node = t.node AND h.lease_token = t.lease_token
         WHERE c.run_id = t.run_id AND c.node = t.node AND c.step_id = t.step_id
           AND c.status = 'started'
        RETURNING c.*
    ), added AS (
        INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                             unsafe, output, error, attempt, started_at,
                                             finished_at)
        SELECT t.run_id, t.node, t.step_id, t.seq, t.function,
               CASE WHEN t.error IS NULL THEN 'succeeded' ELSE 'failed' END, t.unsafe,
               t.output, t.error, h.attempt, v_now, v_now
          FROM item t
          JOIN held h
            ON h.run_id = t.run_id AND h.node = t.node AND h.lease_token = t.lease_token
        -- A STARTED entry conflicts here and is ended above.
        ON CONFLICT (run_id, node, step_id) DO NOTHING
        RETURNING c.*
    )
    SELECT coalesce(array_agg((v_index->>(a.run_id::text || '/' || a.node || '/' || a.step_id))
                              ::integer), '{}'),
           coalesce(array_agg(CASE WHEN NOT p_brief
                                   THEN cyclone._step_call_json(a::cyclone.step_calls) END),
                    '{}')
      INTO v_added, v_calls
      FROM (SELECT * FROM ended UNION ALL SELECT * FROM added) a;

    RETURN QUERY SELECT d.i, false, d.call, NULL::text, NULL::text, NULL::text
                   FROM unnest(v_added, v_calls) d(i, call);

    FOR v_item IN
        SELECT e FROM jsonb_array_elements(p_items) e
         WHERE NOT (e->>'i')::integer = ANY (v_added)
         ORDER BY e->>'run_id', e->>'node', (e->>'i')::integer
    LOOP
        i := (v_item->>'i')::integer;
        BEGIN
            SELECT * INTO v_end FROM cyclone._step_call_end(
                (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                v_item->>'step_id', (v_item->>'seq')::integer, v_item->>'function',
                coalesce((v_item->>'unsafe')::boolean, false), v_item->'output',
                v_item->'error');
            duplicate := v_end.duplicate;
            call := v_end.call;
            error_state := NULL;
            error_message := NULL;
            error_detail := NULL;
        EXCEPTION WHEN SQLSTATE 'CY001' OR SQLSTATE 'CY002' OR SQLSTATE 'CY003'
                    OR SQLSTATE 'CY004' THEN
            GET STACKED DIAGNOSTICS error_state = RETURNED_SQLSTATE,
                                    error_message = MESSAGE_TEXT,
                                    error_detail = PG_EXCEPTION_DETAIL;
            duplicate := NULL;
            call := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone.step_calls_begin_many(p_items jsonb, p_brief boolean DEFAULT false)
RETURNS TABLE (i integer, decision text, run_status text, call jsonb, error_state text,
               error_message text, error_detail text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_started integer[];
    v_status  text[];
    v_calls   jsonb[];
    v_index   jsonb;
    v_item    jsonb;
    v_begun   record;
BEGIN
    -- Where each item is, by its key: the first item of a key wins (a repeat within
    -- the batch is then answered by the pass one at a time).
    SELECT jsonb_object_agg((e->>'run_id') || '/' || (e->>'node') || '/' || (e->>'step_id'),
                            (e->>'i')::integer ORDER BY (e->>'i')::integer DESC)
      INTO v_index
      FROM jsonb_array_elements(p_items) e;

    WITH item AS MATERIALIZED (
        SELECT (e->>'run_id')::uuid AS run_id, e->>'node' AS node,
               (e->>'lease_token')::uuid AS lease_token, e->>'step_id' AS step_id,
               (e->>'seq')::integer AS seq, e->>'function' AS function,
               coalesce((e->>'unsafe')::boolean, false) AS unsafe, e->'output' AS output,
               e->'error' AS error
          FROM jsonb_array_elements(p_items) e
         WHERE coalesce((e->>'unsafe')::boolean, false)
    ), held AS (
        SELECT k.run_id, k.node, k.lease_token, s.attempt
          FROM (SELECT t.run_id, t.node, t.lease_token, count(*) AS n
                  FROM item t GROUP BY t.run_id, t.node, t.lease_token) k
         CROSS JOIN LATERAL (
               SELECT s.attempt FROM cyclone.steps s
                WHERE s.run_id = k.run_id AND s.node = k.node AND s.lease_token = k.lease_token
                  -- By key: see steps_leased_idx.
                  AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
                  FOR SHARE) s
         WHERE k.n + (SELECT count(*) FROM (SELECT 1 FROM cyclone.step_calls c
                                             WHERE c.run_id = k.run_id AND c.node = k.node
                                             LIMIT 10000) x) <= 10000
    ), added AS (
        INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                             unsafe, attempt, started_at)
        SELECT t.run_id, t.node, t.step_id, t.seq, t.function, 'started', true, h.attempt,
               v_now
          FROM item t
          JOIN held h
            ON h.run_id = t.run_id AND h.node = t.node AND h.lease_token = t.lease_token
        ON CONFLICT (run_id, node, step_id) DO NOTHING
        RETURNING c.*
    )
    SELECT coalesce(array_agg((v_index->>(a.run_id::text || '/' || a.node || '/' || a.step_id))
                              ::integer), '{}'),
           coalesce(array_agg(r.status), '{}'),
           coalesce(array_agg(CASE WHEN NOT p_brief
                                   THEN cyclone._step_call_json(a::cyclone.step_calls) END),
                    '{}')
      INTO v_started, v_status, v_calls
      FROM added a
      JOIN cyclone.runs r ON r.run_id = a.run_id;

    RETURN QUERY SELECT d.i, 'run'::text, d.status, d.call, NULL::text, NULL::text, NULL::text
                   FROM unnest(v_started, v_status, v_calls) d(i, status, call);

    FOR v_item IN
        SELECT e FROM jsonb_array_elements(p_items) e
         WHERE NOT (e->>'i')::integer = ANY (v_started)
         ORDER BY (e->>'i')::integer
    LOOP
        i := (v_item->>'i')::integer;
        BEGIN
            SELECT * INTO v_begun FROM cyclone.step_call_begin(
                (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                v_item->>'step_id', (v_item->>'seq')::integer, v_item->>'function',
                coalesce((v_item->>'unsafe')::boolean, false));
            decision := v_begun.decision;
            run_status := v_begun.run_status;
            call := v_begun.call;
            error_state := NULL;
            error_message := NULL;
            error_detail := NULL;
        EXCEPTION WHEN SQLSTATE 'CY001' OR SQLSTATE 'CY002' OR SQLSTATE 'CY003'
                    OR SQLSTATE 'CY004' THEN
            GET STACKED DIAGNOSTICS error_state = RETURNED_SQLSTATE,
                                    error_message = MESSAGE_TEXT,
                                    error_detail = PG_EXCEPTION_DETAIL;
            decision := NULL;
            run_status := NULL;
            call := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone._step_fail_unheld(
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
       SET status = CASE WHEN p_retryable AND s.attempt - s.resumes < s.max_attempts
                         THEN 'available' ELSE 'discarded' END,
           available_at = CASE WHEN p_retryable AND s.attempt - s.resumes < s.max_attempts
                               THEN v_now + coalesce(p_retry_after,
                                                     cyclone._backoff(s.initial_backoff, s.max_backoff,
                                                                      s.backoff_multiplier,
                                                                      s.attempt - s.resumes))
                          END,
           finished_at = CASE WHEN p_retryable AND s.attempt - s.resumes < s.max_attempts
                              THEN NULL ELSE v_now END,
           lease_expires_at = NULL, waiting_for = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
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

CREATE OR REPLACE FUNCTION cyclone.step_abandon(p_run_id uuid, p_node text, p_lease_token uuid,
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
                'node %s (action %s) stopped at attempt %s, started %s, without an '
                'outcome (%s); its effect may have happened. Check, then Resolve '
                'with result, error or discard', p_node, v_step.action,
                v_step.attempt, v_step.started_at,
                left(concat_ws(': ', nullif(p_type, ''), nullif(p_message, '')), 200)),
            'node', p_node, 'attempt', v_step.attempt,
            'started_at', v_step.started_at), v_now);
        v_status := 'blocked';
    END IF;
    RETURN ROW(v_step.status, v_status, false, NULL)::cyclone.completion;
END;
$$;
