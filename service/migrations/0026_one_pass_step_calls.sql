-- An unsafe step call's end and the next begin in one statement (performance, issue
-- 15): CompleteMany's ends and begins were two passes, each locking the batch's runs,
-- checking each node's lease and counting its journal; step_report_many now writes
-- the common cases of both in one statement, each node's lease checked and its
-- journal counted once, and the two passes' functions are gone.
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
