-- Step logs and readable blocked messages.
-- * cyclone.step_logs and cyclone.step_logs_add (service/schema/55_step_logs.sql): the
--   lines handlers log, sent with Heartbeat and Complete, kept per attempt within a cap.
-- * cyclone._when: a time as a message shows it ("2026-05-01 14:03:07 UTC"); the
--   EffectUncertain messages use it, and name their advice once, as the exact command.
--   Functions re-created: cyclone._block_uncertain, cyclone.step_abandon,
--   cyclone.step_call_begin

CREATE FUNCTION cyclone._when(p_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC'
$$;

CREATE TABLE cyclone.step_logs (
    run_id  uuid        NOT NULL,
    node    text        NOT NULL,
    attempt integer     NOT NULL,
    -- Position within the attempt, 1 for the first line; 1001 is the cap's marker.
    seq     integer     NOT NULL,
    at      timestamptz NOT NULL,
    level   text        NOT NULL,
    logger  text        NOT NULL DEFAULT '',
    message text        NOT NULL,
    PRIMARY KEY (run_id, node, attempt, seq),
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE,
    CONSTRAINT step_logs_seq_in_range CHECK (seq BETWEEN 1 AND 1001)
);

-- Appends log lines to held steps: p_items is [{run_id, node, lease_token, lines: [{at,
-- level, logger, message}]}]. Lines of a step whose lease is not held (lost, expired,
-- unknown) are dropped silently: the Heartbeat or Complete in the same transaction
-- reports the lost lease. Stored under the lease's attempt, within the caps above.
-- Called in the transaction of a Heartbeat or a completion that carries lines, before
-- it (a completion ends the lease); never when there are none. Returns the lines kept.
CREATE FUNCTION cyclone.step_logs_add(p_items jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := cyclone.now();
    v_item    jsonb;
    v_line    jsonb;
    v_run_id  uuid;
    v_node    text;
    v_attempt integer;
    v_seq     integer;
    v_bytes   bigint;
    v_text    text;
    v_kept    integer := 0;
BEGIN
    FOR v_item IN SELECT x FROM jsonb_array_elements(p_items) x LOOP
        v_run_id := (v_item->>'run_id')::uuid;
        v_node := v_item->>'node';
        SELECT s.attempt INTO v_attempt FROM cyclone.steps s
         WHERE s.run_id = v_run_id AND s.node = v_node
           AND s.lease_token = (v_item->>'lease_token')::uuid
           -- By key: see steps_leased_idx.
           AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END;
        CONTINUE WHEN NOT FOUND;
        SELECT coalesce(max(l.seq), 0), coalesce(sum(octet_length(l.message)), 0)
          INTO v_seq, v_bytes
          FROM cyclone.step_logs l
         WHERE l.run_id = v_run_id AND l.node = v_node AND l.attempt = v_attempt;
        CONTINUE WHEN v_seq > 1000;  -- the cap's marker is there: the attempt is full
        FOR v_line IN SELECT x FROM jsonb_array_elements(v_item->'lines') x LOOP
            v_text := left(coalesce(v_line->>'message', ''), 4096);
            IF v_seq >= 1000 OR v_bytes + octet_length(v_text) > 262144 THEN
                INSERT INTO cyclone.step_logs (run_id, node, attempt, seq, at, level, logger,
                                               message)
                VALUES (v_run_id, v_node, v_attempt, 1001, v_now, 'WARNING', 'cyclone',
                        'log cap reached (1000 lines or 256 KiB per attempt): the rest '
                        'of this attempt''s lines were dropped');
                EXIT;
            END IF;
            v_seq := v_seq + 1;
            v_bytes := v_bytes + octet_length(v_text);
            INSERT INTO cyclone.step_logs (run_id, node, attempt, seq, at, level, logger,
                                           message)
            VALUES (v_run_id, v_node, v_attempt, v_seq,
                    coalesce((v_line->>'at')::timestamptz, v_now),
                    left(coalesce(nullif(v_line->>'level', ''), 'INFO'), 16),
                    left(coalesce(v_line->>'logger', ''), 200), v_text);
            v_kept := v_kept + 1;
        END LOOP;
    END LOOP;
    RETURN v_kept;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone._block_uncertain(p_unsafe text[])
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
        workflow := cyclone._run_block(v_step.run_id, jsonb_build_object(
            'kind', 'EffectUncertain',
            'message', format(
                'node %s (action %s) lost its lease at attempt %s (started %s) with no '
                'outcome; its effect may have happened. Check, then resolve: cyclone '
                'resolve %s %s --result JSON | --error MSG | --discard', v_step.node,
                v_step.action, v_step.attempt, cyclone._when(v_step.started_at),
                v_step.run_id, v_step.node),
            'node', v_step.node, 'attempt', v_step.attempt,
            'started_at', v_step.started_at), v_now);
        run_id := v_step.run_id;
        node := v_step.node;
        action := v_step.action;
        attempt := v_step.attempt;
        max_attempts := v_step.max_attempts;
        RETURN NEXT;
    END LOOP;
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

CREATE OR REPLACE FUNCTION cyclone.step_call_begin(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_function text, p_unsafe boolean)
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
                                             unsafe, attempt, started_at)
        VALUES (p_run_id, p_node, p_step_id, p_seq, p_function, 'started', true, v_attempt,
                v_now)
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
