-- An unsafe step call's end and the next begin in one statement (performance):
-- CompleteMany's ends and begins were two passes, each locking the batch's runs,
-- checking each node's lease and counting its journal; step_report_many now writes
-- the common cases of both in one statement, each node's lease checked and its
-- journal counted once, and the two passes' functions are gone.
--
-- A step that frees a slot of its concurrency key (completed, or failed and
-- discarded) wakes the claims of its action, as a newly ready step does, and a waiting
-- claim no longer polls every 0.2 s for a key's slot: a key with limit 1 served its
-- queue at most five steps a second to waiting workers.
--
-- steps_leased_idx (the sweep's) names lease_expires_at in its predicate, so that the
-- claim's list of full concurrency keys cannot walk it instead of
-- steps_key_running_idx, as PostgreSQL 15 sometimes planned with fresh statistics
-- (tests/test_plans.py); the reads of every running step state the new condition.
DROP INDEX cyclone.steps_leased_idx;
CREATE INDEX steps_leased_idx ON cyclone.steps (lease_expires_at)
    WHERE status = 'running' AND lease_expires_at IS NOT NULL;

DROP FUNCTION cyclone.step_calls_end_many(jsonb, boolean);
DROP FUNCTION cyclone.step_calls_begin_many(jsonb, boolean);

-- CompleteMany with step calls: ends step calls, begins others, then applies the
-- completions (step_complete_many), in one transaction, so that a node's journal
-- entries are recorded before its completion in the same batch. Every run of the batch
-- is locked first, in run_id order, so that no pass takes a lock out of that order.
--
-- The common cases of ends and begins are one statement, linear in the batch: each
-- held node of the batch once (its lease checked and its row share-locked by key,
-- room in its journal counted once for all its items), then its STARTED entries ended
-- in place, its ended calls with no entry added, and an entry STARTED added for each
-- unsafe call it begins (RUN). The rest one at a time, each in its own
-- subtransaction: the ends through _step_call_end (an entry that has an outcome
-- already, a lost lease, a full journal, a key repeated in the batch), then the
-- begins through step_call_begin (RECORDED, a repeated Begin, UNCERTAIN, a safe call,
-- a lost lease), in request order. A begin of a call the same batch ends is left to
-- that pass, so it sees the end.
--
-- One row per item: kind 'end' (i into p_ends: duplicate and the entry),
-- 'begin' (i into p_begins: the decision, the run's status and the entry) or 'step'
-- (i into p_items), or the refusal of that item alone (error_state CY001 lease lost,
-- CY002 unknown step, CY003 full journal, CY004 bad identity). Ends and begins:
-- {i, run_id, node, lease_token, step_id, seq, function, unsafe}, ends with output or
-- error. p_brief: the entries the batch statement wrote are not returned (call NULL),
-- for a caller that only needs to know that they were recorded. RPC: CompleteMany.
CREATE OR REPLACE FUNCTION cyclone.step_report_many(p_ends jsonb, p_begins jsonb, p_items jsonb,
                                         p_brief boolean DEFAULT false)
RETURNS TABLE (kind text, i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, decision text, call jsonb, error_state text,
               error_message text, error_detail text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_index   jsonb;
    v_kinds   text[] := '{}';
    v_done    integer[] := '{}';
    v_status  text[];
    v_calls   jsonb[];
    v_item    jsonb;
    v_end     record;
    v_begun   record;
BEGIN
    PERFORM 1 FROM cyclone.runs r
     WHERE r.run_id = ANY (ARRAY(SELECT DISTINCT (e->>'run_id')::uuid
                                   FROM jsonb_array_elements(p_ends || p_begins || p_items) e))
     ORDER BY r.run_id
       FOR NO KEY UPDATE;

    IF jsonb_array_length(p_ends) + jsonb_array_length(p_begins) > 0 THEN
        -- Where each item is, by its kind and key: the first item of a key wins (a
        -- repeat within the batch is then answered by the pass one at a time).
        SELECT jsonb_object_agg(k.kind || '/' || (e->>'run_id') || '/' || (e->>'node') || '/'
                                || (e->>'step_id'), (e->>'i')::integer
                                ORDER BY k.kind, (e->>'i')::integer DESC)
          INTO v_index
          FROM (SELECT 'end' AS kind, p_ends AS items UNION ALL SELECT 'begin', p_begins) k
         CROSS JOIN LATERAL jsonb_array_elements(k.items) e;

        WITH ended_item AS MATERIALIZED (
            SELECT (e->>'run_id')::uuid AS run_id, e->>'node' AS node,
                   (e->>'lease_token')::uuid AS lease_token, e->>'step_id' AS step_id,
                   (e->>'seq')::integer AS seq, e->>'function' AS function,
                   coalesce((e->>'unsafe')::boolean, false) AS unsafe, e->'output' AS output,
                   e->'error' AS error
              FROM jsonb_array_elements(p_ends) e
             WHERE (e->'output' IS NULL) <> (e->'error' IS NULL)
        ), begun_item AS MATERIALIZED (
            SELECT (e->>'run_id')::uuid AS run_id, e->>'node' AS node,
                   (e->>'lease_token')::uuid AS lease_token, e->>'step_id' AS step_id,
                   (e->>'seq')::integer AS seq, e->>'function' AS function
              FROM jsonb_array_elements(p_begins) e
             WHERE coalesce((e->>'unsafe')::boolean, false)
               AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_ends) x
                                WHERE x->>'run_id' = e->>'run_id' AND x->>'node' = e->>'node'
                                  AND x->>'step_id' = e->>'step_id')
        ), held AS (
            SELECT k.run_id, k.node, k.lease_token, s.attempt
              FROM (SELECT t.run_id, t.node, t.lease_token, count(*) AS n
                      FROM (SELECT run_id, node, lease_token FROM ended_item
                            UNION ALL
                            SELECT run_id, node, lease_token FROM begun_item) t
                     GROUP BY t.run_id, t.node, t.lease_token) k
             CROSS JOIN LATERAL (
                   SELECT s.attempt FROM cyclone.steps s
                    WHERE s.run_id = k.run_id AND s.node = k.node
                      AND s.lease_token = k.lease_token
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
              FROM ended_item t
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
              FROM ended_item t
              JOIN held h
                ON h.run_id = t.run_id AND h.node = t.node AND h.lease_token = t.lease_token
            -- A STARTED entry conflicts here and is ended above.
            ON CONFLICT (run_id, node, step_id) DO NOTHING
            RETURNING c.*
        ), started AS (
            INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                                 unsafe, attempt, started_at)
            SELECT t.run_id, t.node, t.step_id, t.seq, t.function, 'started', true,
                   h.attempt, v_now
              FROM begun_item t
              JOIN held h
                ON h.run_id = t.run_id AND h.node = t.node AND h.lease_token = t.lease_token
            ON CONFLICT (run_id, node, step_id) DO NOTHING
            RETURNING c.*
        ), written AS (
            SELECT 'end' AS kind, a::cyclone.step_calls AS c FROM ended a
            UNION ALL SELECT 'end', a::cyclone.step_calls FROM added a
            UNION ALL SELECT 'begin', a::cyclone.step_calls FROM started a
        )
        SELECT coalesce(array_agg(w.kind), '{}'),
               coalesce(array_agg((v_index->>(w.kind || '/' || (w.c).run_id::text || '/'
                                              || (w.c).node || '/' || (w.c).step_id))::integer),
                        '{}'),
               coalesce(array_agg(r.status), '{}'),
               coalesce(array_agg(CASE WHEN NOT p_brief THEN cyclone._step_call_json(w.c) END),
                        '{}')
          INTO v_kinds, v_done, v_status, v_calls
          FROM written w
          JOIN cyclone.runs r ON r.run_id = (w.c).run_id;

        RETURN QUERY
            SELECT d.kind, d.i, NULL::text,
                   CASE WHEN d.kind = 'begin' THEN d.status END,
                   CASE WHEN d.kind = 'end' THEN false END, NULL::timestamptz,
                   CASE WHEN d.kind = 'begin' THEN 'run' END, d.call, NULL::text,
                   NULL::text, NULL::text
              FROM unnest(v_kinds, v_done, v_status, v_calls) d(kind, i, status, call);

        FOR v_item IN
            SELECT e FROM jsonb_array_elements(p_ends) e
             WHERE NOT ((e->>'i')::integer = ANY (
                        ARRAY(SELECT d.i FROM unnest(v_kinds, v_done) d(kind, i)
                               WHERE d.kind = 'end')))
             ORDER BY e->>'run_id', e->>'node', (e->>'i')::integer
        LOOP
            kind := 'end';
            i := (v_item->>'i')::integer;
            step_status := NULL;
            run_status := NULL;
            retry_at := NULL;
            decision := NULL;
            BEGIN
                SELECT * INTO v_end FROM cyclone._step_call_end(
                    (v_item->>'run_id')::uuid, v_item->>'node',
                    (v_item->>'lease_token')::uuid, v_item->>'step_id',
                    (v_item->>'seq')::integer, v_item->>'function',
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

        FOR v_item IN
            SELECT e FROM jsonb_array_elements(p_begins) e
             WHERE NOT ((e->>'i')::integer = ANY (
                        ARRAY(SELECT d.i FROM unnest(v_kinds, v_done) d(kind, i)
                               WHERE d.kind = 'begin')))
             ORDER BY (e->>'i')::integer
        LOOP
            kind := 'begin';
            i := (v_item->>'i')::integer;
            step_status := NULL;
            duplicate := NULL;
            retry_at := NULL;
            BEGIN
                SELECT * INTO v_begun FROM cyclone.step_call_begin(
                    (v_item->>'run_id')::uuid, v_item->>'node',
                    (v_item->>'lease_token')::uuid, v_item->>'step_id',
                    (v_item->>'seq')::integer, v_item->>'function',
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
    END IF;

    IF jsonb_array_length(p_items) > 0 THEN
        RETURN QUERY
            SELECT 'step'::text, s.i, s.step_status, s.run_status, s.duplicate, s.retry_at,
                   NULL::text, NULL::jsonb, s.error_state, s.error_message, s.error_detail
              FROM cyclone.step_complete_many(p_items) s;
    END IF;
END;
$$;

-- The completion transition, as the server applies it: a held step (running, same
-- token, lease not expired) becomes completed with its output; its dependents are
-- counted (_settle), or, with none, the run is closed by the count (_run_close). A
-- repeat with the token whose success was recorded answers duplicate = true and
-- changes nothing; any other mismatch raises CY001 (or CY002). RPC: Complete with an
-- output; also called by step_complete and step_complete_many.
CREATE OR REPLACE FUNCTION cyclone._step_complete(p_run_id uuid, p_node text, p_lease_token uuid,
                                       p_output jsonb)
RETURNS cyclone.completion
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now        timestamptz := cyclone.now();
    v_status     text := cyclone._run_lock(p_run_id);
    v_dependents text[];
    v_freed      text;
    v_step       record;
BEGIN
    UPDATE cyclone.steps s
       SET status = 'completed', output = coalesce(p_output, 'null'::jsonb),
           finished_at = v_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
    RETURNING s.dependents, CASE WHEN s.concurrency_key IS NOT NULL THEN s.action END
         INTO v_dependents, v_freed;
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
    IF v_freed IS NOT NULL THEN
        -- A slot of the step's concurrency key is free: wake the claims of its action.
        PERFORM cyclone._notify_ready(ARRAY[v_freed]);
    END IF;
    RETURN ROW('completed', v_status, false, NULL)::cyclone.completion;
END;
$$;

-- CompleteMany: applies a batch of outcomes in one transaction. p_items is a JSON
-- array of {i, run_id, node, lease_token, output} or {..., failure: {type, message,
-- details, retryable, retry_after_s, uncertain}}. Locks every run of the batch in
-- run_id order (so two batches cannot deadlock); applies every success whose lease
-- holds in one statement, closes runs whose completed steps have no dependents by
-- count (_runs_close) and settles the others once per run (_settle); then takes the
-- rest one at a time in (run_id, node) order, each in its own subtransaction so that
-- a refusal (CY001, CY002, CY003) stands alone and is returned in its row: failures
-- through step_fail or step_abandon, and successes the first pass did not apply
-- through _step_complete (a repeat answers duplicate). RPC: CompleteMany.
CREATE OR REPLACE FUNCTION cyclone.step_complete_many(p_items jsonb)
RETURNS TABLE (i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, error_state text, error_message text,
               error_detail text)
LANGUAGE plpgsql
-- Each item's step is found by its key. Left to itself, the planner hashes the whole
-- steps table for the batch's join while the table is small (a few thousand rows,
-- plus the dead versions that a busy table piles up between vacuums): in the waits
-- bench that was a sequential scan per batch, 1.5 million rows read for 3,000 runs.
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := cyclone.now();
    v_applied  integer[];
    v_run      uuid[];
    v_node     text[];
    v_has_deps boolean[];
    v_freed    text[];
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
        RETURNING t.i, s.run_id, s.node, cardinality(s.dependents) > 0 AS has_deps,
                  CASE WHEN s.concurrency_key IS NOT NULL THEN s.action END AS freed
    )
    SELECT coalesce(array_agg(i), '{}'), coalesce(array_agg(run_id), '{}'),
           coalesce(array_agg(node), '{}'), coalesce(array_agg(has_deps), '{}'),
           coalesce(array_agg(DISTINCT freed) FILTER (WHERE freed IS NOT NULL), '{}')
      INTO v_applied, v_run, v_node, v_has_deps, v_freed
      FROM done;
    -- Slots of concurrency keys are free: wake the claims of those steps' actions.
    PERFORM cyclone._notify_ready(v_freed);

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

-- Records a failed attempt of a held step (running, same token, lease not expired). A
-- retryable failure with attempts left (attempt - resumes < max_attempts: a claim that
-- resumed the node after a wait uses up no attempt) makes the step
-- available again after p_retry_after, or else after the node's exponential backoff
-- less a random jitter of up to half (_backoff); otherwise the step is discarded and
-- its dependents judged (_settle). The error joins the step's history (kind handler).
-- CY001 when the lease is lost. Does not look at the run's status: step_fail does.
-- Called only by step_fail.
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
    RETURNING s.status, s.attempt, s.action, s.available_at,
              s.concurrency_key IS NOT NULL AS keyed INTO v_step;
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
    -- A retry is ready (now or later); a discarded step frees a slot of its
    -- concurrency key: either way the claims of its action look again.
    IF v_step.status = 'available' OR v_step.keyed THEN
        PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
    END IF;
    RETURN ROW(v_step.status, (SELECT r.status FROM cyclone.runs r WHERE r.run_id = p_run_id),
               false, v_step.available_at)::cyclone.completion;
END;
$$;

-- Seconds until a claim of these actions may find work (negative: now; NULL: none
-- known). For each action, each priority present among its ready rows is visited
-- once, through steps_ready_idx (a loose index scan), and gives the earliest later
-- available_at of that priority. A ready row whose time has come though the claim
-- just took nothing is held back by its concurrency key or its action's rate limit:
-- the rate's row says when its window opens (reopens_at); a key has no such time, but
-- a step that frees a slot of its key (completed, failed, waiting, reclaimed by the
-- sweep) wakes the claims of its action (_notify_ready), so the claim waits for that
-- (or for the server's --claim-recheck, for a slot freed otherwise: a cancel, or a
-- key that steps of several actions share). Called by a waiting Claim (the named
-- query step_next_due) each time it finds nothing.
CREATE OR REPLACE FUNCTION cyclone.step_next_due(p_actions text[])
RETURNS float8
-- PL/pgSQL keeps a generic plan of the statement (the same index probes for every
-- argument); planning it took four times as long as running it.
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (
    WITH RECURSIVE clock(now) AS (SELECT cyclone.now()),
    levels(action, priority) AS (
        SELECT a.action, (SELECT s.priority FROM cyclone.steps s
                           WHERE s.status = 'available' AND s.action = a.action
                           ORDER BY s.priority DESC LIMIT 1)
          FROM (SELECT DISTINCT x FROM unnest(p_actions) x) AS a(action)
        UNION ALL
        SELECT l.action, (SELECT s.priority FROM cyclone.steps s
                           WHERE s.status = 'available' AND s.action = l.action
                             AND s.priority < l.priority
                           ORDER BY s.priority DESC LIMIT 1)
          FROM levels l
         WHERE l.priority IS NOT NULL
    )
    SELECT extract(epoch FROM min(d.due) - min(c.now))::float8
      FROM clock c
     CROSS JOIN levels l
     CROSS JOIN LATERAL (
           SELECT (SELECT s.available_at FROM cyclone.steps s
                    WHERE s.status = 'available' AND s.action = l.action
                      AND s.priority = l.priority
                    ORDER BY s.available_at LIMIT 1) AS first_at,
                  (SELECT s.available_at FROM cyclone.steps s
                    WHERE s.status = 'available' AND s.action = l.action
                      AND s.priority = l.priority AND s.available_at > c.now
                    ORDER BY s.available_at LIMIT 1) AS next_at) f
     CROSS JOIN LATERAL (
           SELECT least(f.next_at,
                        CASE WHEN f.first_at <= c.now THEN
                            (SELECT t.reopens_at FROM cyclone.action_rates t
                              WHERE t.action = l.action AND t.reopens_at > c.now) END)
                  AS due) d
     WHERE l.priority IS NOT NULL);
END;
$$;
