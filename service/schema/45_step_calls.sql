-- The journal of durable functions: BeginStepCall, EndStepCall, and the recording of a
-- step call in a worker's own transaction. Every entry is written by the holder of its
-- node's lease (or by step_call_resolve, while the node is uncertain), so each
-- function checks the lease token first and keeps the step row share-locked: no
-- transition can take the lease between the check and the write.

-- Refuses a step call's identity that no SDK sends: step_id and function of 1 to 200
-- characters, none a control character; seq from 1 to 100000. CY004.
CREATE FUNCTION cyclone._step_call_check(p_step_id text, p_seq integer, p_function text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_step_id IS NULL OR length(p_step_id) NOT BETWEEN 1 AND 200
       OR p_step_id ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'step_id must be 1 to 200 printable characters'
            USING ERRCODE = 'CY004';
    END IF;
    IF p_function IS NULL OR length(p_function) NOT BETWEEN 1 AND 200
       OR p_function ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'function must be 1 to 200 printable characters'
            USING ERRCODE = 'CY004';
    END IF;
    IF p_seq IS NULL OR p_seq NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'seq must be between 1 and 100000, got %', p_seq
            USING ERRCODE = 'CY004';
    END IF;
END;
$$;

-- A step call's arguments digest as stored: NULL for none (NULL or empty), else 64
-- lowercase hexadecimal characters (a SHA-256, docs/other-languages.md); anything else
-- is refused, CY004.
CREATE FUNCTION cyclone._step_call_digest(p_args_digest text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_args_digest IS NULL OR p_args_digest = '' THEN
        RETURN NULL;
    END IF;
    IF p_args_digest !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'args_digest must be 64 lowercase hexadecimal characters or empty'
            USING ERRCODE = 'CY004';
    END IF;
    RETURN p_args_digest;
END;
$$;

-- The attempt of a held step (running, this token, lease not expired), with its row
-- share-locked until the transaction ends when p_lock (a caller that writes the
-- journal); else the error _lease_lost raises (CY001, or CY002 for an unknown step).
CREATE FUNCTION cyclone._step_held(p_run_id uuid, p_node text, p_lease_token uuid,
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

-- Refuses a new entry past the 10,000 a node's journal may hold (CY003).
CREATE FUNCTION cyclone._step_call_room(p_run_id uuid, p_node text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT count(*) FROM (SELECT 1 FROM cyclone.step_calls c
                               WHERE c.run_id = p_run_id AND c.node = p_node
                               LIMIT 10000) n) >= 10000 THEN
        RAISE EXCEPTION 'node % already has 10000 step calls in its journal, the limit',
            p_node USING ERRCODE = 'CY003';
    END IF;
END;
$$;

-- Begins a step call of the held step. Returns the decision, the run's status and the
-- entry (NULL for RUN of a safe call):
--   RECORDED   the call has an outcome: the caller replays it;
--   RUN        no outcome: for an unsafe call, an entry `started` is written first
--              (or was written by this same attempt: a repeated Begin); a safe call
--              writes nothing;
--   UNCERTAIN  an unsafe call whose `started` entry an earlier attempt left: its effect
--              may have happened. The node's lease ends; in a running run the node
--              becomes uncertain and the run blocked (EffectUncertain naming the node
--              and step_id; _run_block), in a blocked run it is held (pending,
--              effect_uncertain) and blocks the run again when it replays. The error
--              joins the node's history (kind handler, type EffectUncertain).
-- The `started` entry keeps p_args_digest (the digest of the call's arguments, NULL or
-- empty for none). An unsafe call takes the run lock first, as Complete does. CY001
-- when the lease is lost, CY004 for a bad identity or digest, CY003 past the journal's
-- limit. RPC: BeginStepCall.
CREATE FUNCTION cyclone.step_call_begin(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_function text, p_unsafe boolean, p_args_digest text DEFAULT NULL)
RETURNS TABLE (decision text, run_status text, call jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_status  text;
    v_attempt integer;
    v_call    cyclone.step_calls;
    v_found   boolean;
    v_message text;
    v_digest  text := cyclone._step_call_digest(p_args_digest);
BEGIN
    PERFORM cyclone._step_call_check(p_step_id, p_seq, p_function);
    IF p_unsafe THEN
        v_status := cyclone._run_lock(p_run_id);
    END IF;
    v_attempt := cyclone._step_held(p_run_id, p_node, p_lease_token, p_unsafe);
    IF v_status IS NULL THEN
        SELECT r.status INTO v_status FROM cyclone.runs r WHERE r.run_id = p_run_id;
    END IF;
    SELECT * INTO v_call FROM cyclone.step_calls c
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id;
    v_found := FOUND;
    IF v_found AND v_call.status <> 'started' THEN
        RETURN QUERY SELECT 'recorded', v_status, cyclone._step_call_json(v_call);
        RETURN;
    END IF;
    IF NOT p_unsafe THEN
        RETURN QUERY SELECT 'run', v_status, NULL::jsonb;
        RETURN;
    END IF;
    IF NOT v_found THEN
        PERFORM cyclone._step_call_room(p_run_id, p_node);
        INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                             unsafe, attempt, started_at, args_digest)
        VALUES (p_run_id, p_node, p_step_id, p_seq, p_function, 'started', true, v_attempt,
                v_now, v_digest)
        RETURNING c.* INTO v_call;
        RETURN QUERY SELECT 'run', v_status, cyclone._step_call_json(v_call);
        RETURN;
    END IF;
    IF v_call.attempt = v_attempt THEN
        RETURN QUERY SELECT 'run', v_status, cyclone._step_call_json(v_call);
        RETURN;
    END IF;

    -- Started by an earlier attempt, no outcome: its effect may have happened.
    v_message := format(
        'node %s: step call %s (function %s) started at attempt %s (%s) with no outcome; '
        'its effect may have happened. Check, then resolve: cyclone resolve %s %s '
        '--result JSON | --error MSG | --discard', p_node, p_step_id, v_call.function,
        v_call.attempt, cyclone._when(v_call.started_at), p_run_id, p_step_id);
    UPDATE cyclone.steps s
       SET status = CASE WHEN v_status = 'running' THEN 'uncertain' ELSE 'pending' END,
           available_at = NULL, lease_expires_at = NULL, lease_token = NULL,
           effect_uncertain = true, unsafe = true
     WHERE s.run_id = p_run_id AND s.node = p_node;
    INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
    VALUES (p_run_id, p_node, v_attempt, 'handler', 'EffectUncertain', v_message, false,
            v_now);
    IF v_status = 'running' THEN
        PERFORM cyclone._run_block(p_run_id, jsonb_build_object(
            'kind', 'EffectUncertain', 'message', v_message, 'node', p_node,
            'attempt', v_call.attempt, 'started_at', v_call.started_at,
            'step_id', p_step_id, 'function', v_call.function), v_now);
        v_status := 'blocked';
    END IF;
    RETURN QUERY SELECT 'uncertain', v_status, cyclone._step_call_json(v_call);
END;
$$;

-- Ends a step call of the held step with its outcome: p_output (success; JSON null
-- when it returned nothing) or p_error ({type, message, details}), exactly one. A
-- `started` entry is updated in place (attempt, finished_at); with no entry one is
-- added (started_at = now); an entry that has an outcome already is left as it is and
-- answered with duplicate = true. p_args_digest (NULL or empty for none) is kept with
-- the entry; a `started` entry keeps its own when none is given. CY001 when the lease
-- is lost, CY004 for a bad identity, digest or outcome, CY003 past the journal's limit. RPC: EndStepCall (the server
-- commits a safe call's end without waiting for its flush: losing it only runs a safe
-- call again); also called by step_call_record.
CREATE FUNCTION cyclone._step_call_end(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_function text, p_unsafe boolean, p_output jsonb, p_error jsonb,
    p_args_digest text DEFAULT NULL)
RETURNS TABLE (duplicate boolean, call jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_attempt integer;
    v_call    cyclone.step_calls;
    v_digest  text := cyclone._step_call_digest(p_args_digest);
BEGIN
    PERFORM cyclone._step_call_check(p_step_id, p_seq, p_function);
    IF (p_output IS NULL) = (p_error IS NULL) THEN
        RAISE EXCEPTION 'a step call ends with exactly one of output or error'
            USING ERRCODE = 'CY004';
    END IF;
    v_attempt := cyclone._step_held(p_run_id, p_node, p_lease_token, true);
    UPDATE cyclone.step_calls c
       SET status = CASE WHEN p_error IS NULL THEN 'succeeded' ELSE 'failed' END,
           output = p_output, error = p_error, attempt = v_attempt, finished_at = v_now,
           args_digest = coalesce(v_digest, c.args_digest)
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id
       AND c.status = 'started'
    RETURNING c.* INTO v_call;
    IF NOT FOUND THEN
        SELECT * INTO v_call FROM cyclone.step_calls c
         WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id;
        IF FOUND THEN
            RETURN QUERY SELECT true, cyclone._step_call_json(v_call);
            RETURN;
        END IF;
        PERFORM cyclone._step_call_room(p_run_id, p_node);
        INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                             unsafe, output, error, attempt, started_at,
                                             finished_at, args_digest)
        VALUES (p_run_id, p_node, p_step_id, p_seq, p_function,
                CASE WHEN p_error IS NULL THEN 'succeeded' ELSE 'failed' END, p_unsafe,
                p_output, p_error, v_attempt, v_now, v_now, v_digest)
        ON CONFLICT (run_id, node, step_id) DO NOTHING
        RETURNING c.* INTO v_call;
        IF NOT FOUND THEN
            SELECT * INTO v_call FROM cyclone.step_calls c
             WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id;
            RETURN QUERY SELECT true, cyclone._step_call_json(v_call);
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT false, cyclone._step_call_json(v_call);
END;
$$;

-- Records a step call's success inside a worker's own transaction, after its business
-- writes (docs/exactly-once.md), so that the call's Postgres effect commits with its
-- record, once: a repeat (the call has an outcome already) raises CY005 and a lost
-- lease CY001, and either rolls the business write back. An unsafe call's `started`
-- entry is updated in place. p_args_digest, the digest of the call's arguments (NULL
-- or empty for none, CY004 when malformed), is kept with the entry. SECURITY DEFINER
-- with a pinned search_path, executable by cyclone_worker (90_roles.sql): the lease
-- token is the capability. Not called by the server.
CREATE FUNCTION cyclone.step_call_record(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_function text, p_output jsonb, p_args_digest text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_done record;
BEGIN
    SELECT * INTO v_done FROM cyclone._step_call_end(
        p_run_id, p_node, p_lease_token, p_step_id, p_seq, p_function,
        EXISTS (SELECT 1 FROM cyclone.step_calls c
                 WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id
                   AND c.unsafe),
        coalesce(p_output, 'null'::jsonb), NULL, p_args_digest);
    IF v_done.duplicate THEN
        RAISE EXCEPTION 'step call % of (%, %) already has an outcome', left(p_step_id, 200),
            p_run_id, p_node
            USING ERRCODE = 'CY005',
                  DETAIL = 'This call repeats a step call whose outcome was committed before.',
                  HINT = 'Roll back: the call''s effect was committed with its first record.';
    END IF;
    RETURN v_done.call;
END;
$$;

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
-- {i, run_id, node, lease_token, step_id, seq, function, unsafe, args_digest}, ends
-- with output or error (args_digest validated by the caller; the table's check
-- refuses a malformed one). p_brief: the entries the batch statement wrote are not returned (call NULL),
-- for a caller that only needs to know that they were recorded. RPC: CompleteMany.
CREATE FUNCTION cyclone.step_report_many(p_ends jsonb, p_begins jsonb, p_items jsonb,
                                         p_brief boolean DEFAULT false)
RETURNS TABLE (kind text, i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, decision text, call jsonb, error_state text,
               error_message text, error_detail text)
LANGUAGE plpgsql
-- Generic plans, here and in the functions it calls (step_complete_many says why).
SET plan_cache_mode = force_generic_plan
AS $$
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
                   e->'error' AS error, nullif(e->>'args_digest', '') AS args_digest
              FROM jsonb_array_elements(p_ends) e
             WHERE (e->'output' IS NULL) <> (e->'error' IS NULL)
        ), begun_item AS MATERIALIZED (
            SELECT (e->>'run_id')::uuid AS run_id, e->>'node' AS node,
                   (e->>'lease_token')::uuid AS lease_token, e->>'step_id' AS step_id,
                   (e->>'seq')::integer AS seq, e->>'function' AS function,
                   nullif(e->>'args_digest', '') AS args_digest
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
                   output = t.output, error = t.error, attempt = h.attempt, finished_at = v_now,
                   args_digest = coalesce(t.args_digest, c.args_digest)
              FROM ended_item t
              JOIN held h
                ON h.run_id = t.run_id AND h.node = t.node AND h.lease_token = t.lease_token
             WHERE c.run_id = t.run_id AND c.node = t.node AND c.step_id = t.step_id
               AND c.status = 'started'
            RETURNING c.*
        ), added AS (
            INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                                 unsafe, output, error, attempt, started_at,
                                                 finished_at, args_digest)
            SELECT t.run_id, t.node, t.step_id, t.seq, t.function,
                   CASE WHEN t.error IS NULL THEN 'succeeded' ELSE 'failed' END, t.unsafe,
                   t.output, t.error, h.attempt, v_now, v_now, t.args_digest
              FROM ended_item t
              JOIN held h
                ON h.run_id = t.run_id AND h.node = t.node AND h.lease_token = t.lease_token
            -- A STARTED entry conflicts here and is ended above.
            ON CONFLICT (run_id, node, step_id) DO NOTHING
            RETURNING c.*
        ), started AS (
            INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                                 unsafe, attempt, started_at, args_digest)
            SELECT t.run_id, t.node, t.step_id, t.seq, t.function, 'started', true,
                   h.attempt, v_now, t.args_digest
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
                    v_item->'error', v_item->>'args_digest');
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
                    coalesce((v_item->>'unsafe')::boolean, false), v_item->>'args_digest');
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
