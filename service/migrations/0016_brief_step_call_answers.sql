-- CompleteMany's brief answers, for speed: a worker that only needs the decision
-- of a step call's begin and the fact of its end asks for answers without their
-- journal entries; building, sending and parsing them was a fifth of an unsafe call.
--   step_calls_end_many, step_calls_begin_many, step_report_many  gain p_brief

DROP FUNCTION cyclone.step_report_many(jsonb, jsonb, jsonb);
DROP FUNCTION cyclone.step_calls_begin_many(jsonb);
DROP FUNCTION cyclone.step_calls_end_many(jsonb);

-- Ends many step calls in one transaction, each as _step_call_end would end it, with
-- one row per item (its "i"): duplicate and the entry, or the refusal of that item
-- alone (error_state CY001 lease lost, CY002 unknown step, CY003 full journal, CY004
-- bad identity). Every run of the batch is locked first, in run_id order, as
-- step_complete_many locks them, so that the two never deadlock. The new entries of
-- held steps whose journal has room are added, and their STARTED entries ended in
-- place, in one statement, linear in the batch (each node's lease checked once, by
-- key); the rest (an entry that has an outcome, a lost lease, a full journal) one at a
-- time through _step_call_end, each in its own subtransaction. Items: {i, run_id, node,
-- lease_token, step_id, seq, function, unsafe, and output or error}. p_brief: the
-- entries added or ended in the batch statement are not returned (call NULL), for a
-- caller that only needs to know that they were recorded. RPC: CompleteMany's
-- step_call_ends.
CREATE FUNCTION cyclone.step_calls_end_many(p_items jsonb, p_brief boolean DEFAULT false)
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
                WHERE s.run_id = k.run_id AND s.node = k.node AND s.status = 'running'
                  AND s.lease_token = k.lease_token AND s.lease_expires_at > v_now
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

-- Begins many step calls in one transaction, each as step_call_begin would, with one
-- row per item (its "i"): the decision, the run's status and the entry, or the
-- refusal of that item alone (error_state CY001 lease lost, CY002 unknown step, CY003
-- full journal, CY004 bad identity). The common case, an unsafe call of a held node
-- with no entry yet, is recorded STARTED for the whole batch in one statement (RUN);
-- the rest (an entry that exists: RECORDED, a repeated Begin, UNCERTAIN; a safe call;
-- a lost lease) one at a time through step_call_begin, each in its own
-- subtransaction, in request order. The caller locks the runs of the batch first
-- (step_report_many). Items: {i, run_id, node, lease_token, step_id, seq, function,
-- unsafe}. p_brief: the STARTED entries of the batch statement's RUN answers are not
-- returned (call NULL). RPC: CompleteMany's step_call_begins.
CREATE FUNCTION cyclone.step_calls_begin_many(p_items jsonb, p_brief boolean DEFAULT false)
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
                WHERE s.run_id = k.run_id AND s.node = k.node AND s.status = 'running'
                  AND s.lease_token = k.lease_token AND s.lease_expires_at > v_now
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

-- CompleteMany with step calls: ends step calls (step_calls_end_many), begins others
-- (step_calls_begin_many), then applies the completions (step_complete_many), in one
-- transaction, so that a node's journal entries are recorded before its completion in
-- the same batch. Every run of the batch is locked first, in run_id order, so that no
-- pass takes a lock out of that order. One row per item: kind 'end' (i into p_ends),
-- 'begin' (i into p_begins) or 'step' (i into p_items). p_brief as in
-- step_calls_end_many and step_calls_begin_many. RPC: CompleteMany.
CREATE FUNCTION cyclone.step_report_many(p_ends jsonb, p_begins jsonb, p_items jsonb,
                                         p_brief boolean DEFAULT false)
RETURNS TABLE (kind text, i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, decision text, call jsonb, error_state text,
               error_message text, error_detail text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM cyclone.runs r
     WHERE r.run_id = ANY (ARRAY(SELECT DISTINCT (e->>'run_id')::uuid
                                   FROM jsonb_array_elements(p_ends || p_begins || p_items) e))
     ORDER BY r.run_id
       FOR NO KEY UPDATE;
    IF jsonb_array_length(p_ends) > 0 THEN
        RETURN QUERY
            SELECT 'end'::text, c.i, NULL::text, NULL::text, c.duplicate,
                   NULL::timestamptz, NULL::text, c.call, c.error_state, c.error_message,
                   c.error_detail
              FROM cyclone.step_calls_end_many(p_ends, p_brief) c;
    END IF;
    IF jsonb_array_length(p_begins) > 0 THEN
        RETURN QUERY
            SELECT 'begin'::text, b.i, NULL::text, b.run_status, NULL::boolean,
                   NULL::timestamptz, b.decision, b.call, b.error_state, b.error_message,
                   b.error_detail
              FROM cyclone.step_calls_begin_many(p_begins, p_brief) b;
    END IF;
    IF jsonb_array_length(p_items) > 0 THEN
        RETURN QUERY
            SELECT 'step'::text, s.i, s.step_status, s.run_status, s.duplicate, s.retry_at,
                   NULL::text, NULL::jsonb, s.error_state, s.error_message, s.error_detail
              FROM cyclone.step_complete_many(p_items) s;
    END IF;
END;
$$;
