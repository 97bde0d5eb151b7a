-- Waiting without a worker: durable sleep, events sent to a run, and (with the child
-- runs of 48_children.sql) waiting for a child's outcome. A wait is a step call of its
-- node's journal (function cyclone.sleep, cyclone.event or cyclone.child). While it
-- waits the node holds no lease: it is `available` from the wait's wake time (or
-- woken earlier by SendEvent), and its next claim replays the body up to the same wait,
-- which asks step_wait again. A wait costs a row, not a worker slot.

-- Events sent to a run (SendEvent), kept until a wait consumes them, the oldest first,
-- each once. Deleted with their run.
CREATE TABLE cyclone.events (
    run_id           uuid        NOT NULL REFERENCES cyclone.runs ON DELETE CASCADE,
    -- Increasing in the order events are sent (across runs).
    event_id         bigint      GENERATED ALWAYS AS IDENTITY,
    name             text        NOT NULL,
    -- JSON null when the sender gave none.
    payload          jsonb       NOT NULL,
    -- The sender's idempotency key: a repeated SendEvent with it sends nothing.
    key              text,
    sent_at          timestamptz NOT NULL,
    sent_by          text        NOT NULL,
    -- The wait that consumed the event: its node and step_id, and when.
    consumed_at      timestamptz,
    consumed_node    text,
    consumed_step_id text,
    PRIMARY KEY (run_id, event_id),
    CONSTRAINT events_consumed_by_one_wait
        CHECK ((consumed_at IS NULL) = (consumed_node IS NULL)
               AND (consumed_node IS NULL) = (consumed_step_id IS NULL))
);
CREATE UNIQUE INDEX events_key_idx ON cyclone.events (run_id, key) WHERE key IS NOT NULL;
-- A wait finds the oldest event of its name not consumed yet by key.
CREATE INDEX events_unconsumed_idx ON cyclone.events (run_id, name, event_id)
    WHERE consumed_at IS NULL;

-- The time a node that waits with no time limit is available from: never, unless it
-- is woken (an event sent, a child finished). A finite time, so that every reader
-- of available_at (claims, Explain, GetRun) keeps working.
CREATE FUNCTION cyclone._wait_forever() RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT timestamptz '9999-12-31 00:00:00+00'
$$;

-- Refuses an event name or key no SDK sends: 1 to 200 characters, none a control
-- character (p_what names it in the error). CY004.
CREATE FUNCTION cyclone._event_text_check(p_value text, p_what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NULL OR length(p_value) NOT BETWEEN 1 AND 200 OR p_value ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION '% must be 1 to 200 printable characters', p_what
            USING ERRCODE = 'CY004';
    END IF;
END;
$$;

-- The outcome of a wait for a child run: NULL while the child is not finished, else
-- {"output": value} or {"error": {type, message, details}}. Replaced by the child runs'
-- migration (48_children.sql); until then a child wait is refused (CY004).
CREATE FUNCTION cyclone._wait_child(p_run_id uuid, p_node text, p_step_id text,
                                    p_child uuid)
RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'waiting for a child run is not supported by this server'
        USING ERRCODE = 'CY004';
END;
$$;

-- A durable function waits, in one transaction, fenced by the lease (CY001, and the
-- run locked first): p_function is cyclone.sleep (until p_wake_at), cyclone.event
-- (p_event, within p_timeout; NULL: no limit) or cyclone.child (p_child). The first
-- call records the wait WAITING with its wake time (the sleep's end, the event's
-- deadline, NULL for none) and what it waits for; a later call of the same step_id
-- (a replay) keeps both. Returns:
--   ready      the entry is now SUCCEEDED (the sleep is over; the oldest unconsumed
--              event of that name is consumed, its payload the output; the child
--              finished) or FAILED (EventTimeout: the deadline passed with no event),
--              or had its outcome already; the node keeps its lease;
--   suspended  the entry stays WAITING and the node gives up its lease: available from
--              the wake time (_wait_forever() for none; pending while the run is
--              blocked), lease cleared, resumes + 1 (so this claim does not use up an
--              attempt: step_fail and the sweep compare attempt - resumes -
--              recoveries with max_attempts), waiting_for set ("sleep", "event <name>",
--              "child <run_id>"). Waiting claims are notified, so that they look at
--              the new wake time.
-- CY004 for a bad identity or wait, or a step_id recorded for another call; CY003
-- past the journal's limit. RPC: Wait; also the server's loop for DAG event nodes.
CREATE FUNCTION cyclone.step_wait(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_function text, p_wake_at timestamptz, p_event text, p_timeout interval,
    p_child uuid)
RETURNS TABLE (decision text, call jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_status  text;
    v_paused  boolean;
    v_updates boolean;
    v_started timestamptz;
    v_attempt integer;
    v_for     text;
    v_call    cyclone.step_calls;
    v_outcome jsonb;
    v_payload jsonb;
    v_action  text;
BEGIN
    PERFORM cyclone._step_call_check(p_step_id, p_seq, p_function);
    IF p_function = 'cyclone.sleep' THEN
        IF p_wake_at IS NULL OR NOT isfinite(p_wake_at) THEN
            RAISE EXCEPTION 'a sleep needs a finite wake time' USING ERRCODE = 'CY004';
        END IF;
        v_for := 'sleep';
    ELSIF p_function = 'cyclone.event' THEN
        PERFORM cyclone._event_text_check(p_event, 'an event name');
        IF p_timeout IS NOT NULL
           AND (p_timeout < interval '1 millisecond' OR p_timeout > interval '366 days') THEN
            RAISE EXCEPTION 'an event timeout must be between 1ms and 366 days, got %',
                p_timeout USING ERRCODE = 'CY004';
        END IF;
        v_for := 'event ' || p_event;
    ELSIF p_function = 'cyclone.child' THEN
        IF p_child IS NULL THEN
            RAISE EXCEPTION 'a child wait needs the child''s run_id' USING ERRCODE = 'CY004';
        END IF;
        v_for := 'child ' || p_child;
    ELSE
        RAISE EXCEPTION 'a wait''s function is cyclone.sleep, cyclone.event or cyclone.child'
            USING ERRCODE = 'CY004';
    END IF;

    v_status := cyclone._run_lock(p_run_id);
    v_attempt := cyclone._step_held(p_run_id, p_node, p_lease_token, true);
    SELECT * INTO v_call FROM cyclone.step_calls c
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id;
    IF FOUND THEN
        IF v_call.function <> p_function OR v_call.waiting_for IS DISTINCT FROM v_for THEN
            RAISE EXCEPTION 'step call % of node % is recorded as % (%), not as this wait (%)',
                p_step_id, p_node, v_call.function, coalesce(v_call.waiting_for, 'no wait'),
                v_for USING ERRCODE = 'CY004';
        END IF;
        IF v_call.status <> 'waiting' THEN
            RETURN QUERY SELECT 'ready', cyclone._step_call_json(v_call);
            RETURN;
        END IF;
    ELSE
        PERFORM cyclone._step_call_room(p_run_id, p_node);
        INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                             unsafe, attempt, started_at, wake_at,
                                             waiting_for)
        VALUES (p_run_id, p_node, p_step_id, p_seq, p_function, 'waiting', false, v_attempt,
                -- Searched, not simple, CASE: Citus sends the simple form to the shard
                -- as a comparison of text with boolean.
                v_now, CASE WHEN p_function = 'cyclone.sleep' THEN p_wake_at
                            WHEN p_function = 'cyclone.event' THEN v_now + p_timeout END,
                v_for)
        RETURNING c.* INTO v_call;
    END IF;

    IF p_function = 'cyclone.sleep' THEN
        IF v_call.wake_at <= v_now THEN
            v_outcome := jsonb_build_object('output', 'null'::jsonb);
        END IF;
    ELSIF p_function = 'cyclone.event' THEN
        UPDATE cyclone.events e
           SET consumed_at = v_now, consumed_node = p_node, consumed_step_id = p_step_id
         WHERE e.run_id = p_run_id
           AND e.event_id = (SELECT o.event_id FROM cyclone.events o
                              WHERE o.run_id = p_run_id AND o.name = p_event
                                AND o.consumed_at IS NULL
                              ORDER BY o.event_id LIMIT 1)
        RETURNING e.payload INTO v_payload;
        IF FOUND THEN
            v_outcome := jsonb_build_object('output', v_payload);
        ELSIF v_call.wake_at <= v_now THEN
            v_outcome := jsonb_build_object('error', jsonb_build_object(
                'type', 'EventTimeout',
                'message', format('no event %s came within %s', p_event,
                                  v_call.wake_at - v_call.started_at),
                'details', ''));
        END IF;
    ELSE
        v_outcome := cyclone._wait_child(p_run_id, p_node, p_step_id, p_child);
    END IF;

    IF v_outcome IS NOT NULL THEN
        UPDATE cyclone.step_calls c
           SET status = CASE WHEN v_outcome ? 'error' THEN 'failed' ELSE 'succeeded' END,
               output = v_outcome->'output', error = v_outcome->'error', attempt = v_attempt,
               finished_at = v_now
         WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id
        RETURNING c.* INTO v_call;
        UPDATE cyclone.steps s SET waiting_for = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.waiting_for IS NOT NULL;
        RETURN QUERY SELECT 'ready', cyclone._step_call_json(v_call);
        RETURN;
    END IF;

    -- In a paused run the node is held pending with its wake time (run_resume).
    v_paused := (SELECT r.paused_at IS NOT NULL FROM cyclone.runs r WHERE r.run_id = p_run_id);
    -- Updates sent since this attempt started and not applied yet, read
    -- first: Citus takes no function but an immutable one in a CASE of an UPDATE.
    SELECT s.started_at INTO v_started FROM cyclone.steps s
     WHERE s.run_id = p_run_id AND s.node = p_node;
    v_updates := EXISTS (
        SELECT 1 FROM cyclone.run_updates u
         WHERE u.run_id = p_run_id AND u.node = p_node AND u.created_at > v_started
           AND NOT EXISTS (SELECT 1 FROM cyclone.step_calls c
                            WHERE c.run_id = p_run_id AND c.node = p_node
                              AND c.step_id = 'update:' || u.update_id));
    UPDATE cyclone.steps s
       SET status = CASE WHEN v_status = 'running' AND NOT v_paused THEN 'available'
                         ELSE 'pending' END,
           -- An update sent while this attempt ran and not applied yet (update_send
           -- could not wake a running node; the body fetched the updates sent before
           -- it asked): available at once, for the next attempt to apply it here.
           available_at = CASE WHEN v_status <> 'running' THEN NULL
                               WHEN v_updates
                               THEN v_now
                               ELSE coalesce(v_call.wake_at, cyclone._wait_forever()) END,
           lease_token = NULL, lease_expires_at = NULL, resumes = s.resumes + 1,
           waiting_for = v_for
     WHERE s.run_id = p_run_id AND s.node = p_node
    RETURNING s.action INTO v_action;
    IF v_status = 'running' AND NOT v_paused THEN
        PERFORM cyclone._notify_ready(ARRAY[v_action]);
    END IF;
    RETURN QUERY SELECT 'suspended', cyclone._step_call_json(v_call);
END;
$$;

-- Wakes the nodes of a run that wait for p_waiting_for ("event <name>", "child
-- <run_id>"): available now instead of at their wake time, their actions notified,
-- so that a claim takes them at once; their body replays to the wait, which then
-- finds what it waits for. Called by event_send, which holds the run lock, and by
-- _child_finished for a finishing child run, which holds the child's lock only
-- (child_wait, 48_children.sql, says why that is enough).
CREATE FUNCTION cyclone._wake_waiting(p_run_id uuid, p_waiting_for text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := cyclone.now();
    v_woken text[];
BEGIN
    -- A node held while its run is paused (pending, its wake time kept) is woken too:
    -- run_resume then makes it available at once.
    WITH woken AS (
        UPDATE cyclone.steps s SET available_at = v_now
         WHERE s.run_id = p_run_id AND s.status IN ('available', 'pending')
           AND s.waiting_for = p_waiting_for AND s.available_at > v_now
        RETURNING s.action, s.status)
    SELECT array_agg(action) FILTER (WHERE status = 'available') INTO v_woken FROM woken;
    PERFORM cyclone._notify_ready(coalesce(v_woken, '{}'));
END;
$$;

-- Sends an event to a run: kept until a wait of that name consumes it. With p_key, a
-- repeated call returns the event it sent first (created = false) and changes
-- nothing, whatever the run's status. Otherwise the run must not be completed or
-- cancelled (CY003); the event is added, the action audited (send_event, with
-- p_actor), and the run's nodes waiting for that name are woken: available now, their
-- actions notified. CY002 for an unknown run, CY004 for a bad name or key.
-- RPC: SendEvent.
CREATE FUNCTION cyclone.event_send(p_run_id uuid, p_name text, p_payload jsonb, p_key text,
                                   p_actor text)
RETURNS TABLE (event_id bigint, created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text;
    v_id     bigint;
BEGIN
    PERFORM cyclone._event_text_check(p_name, 'an event name');
    IF p_key IS NOT NULL THEN
        PERFORM cyclone._event_text_check(p_key, 'an event key');
    END IF;
    v_status := cyclone._run_lock(p_run_id);
    IF p_key IS NOT NULL THEN
        SELECT e.event_id INTO v_id FROM cyclone.events e
         WHERE e.run_id = p_run_id AND e.key = p_key;
        IF FOUND THEN
            RETURN QUERY SELECT v_id, false;
            RETURN;
        END IF;
    END IF;
    IF v_status IN ('completed', 'cancelled') THEN
        RAISE EXCEPTION 'run % is %: it takes no more events', p_run_id, v_status
            USING ERRCODE = 'CY003';
    END IF;
    INSERT INTO cyclone.events AS e (run_id, name, payload, key, sent_at, sent_by)
    VALUES (p_run_id, p_name, coalesce(p_payload, 'null'::jsonb), p_key, v_now, p_actor)
    RETURNING e.event_id INTO v_id;
    INSERT INTO cyclone.audit (run_id, action, actor, details, at)
    VALUES (p_run_id, 'send_event', p_actor,
            jsonb_strip_nulls(jsonb_build_object('name', p_name, 'event_id', v_id,
                                                 'key', p_key)), v_now);
    PERFORM cyclone._wake_waiting(p_run_id, 'event ' || p_name);
    RETURN QUERY SELECT v_id, true;
END;
$$;
