-- Queries and updates of durable functions: the tables and functions of
-- service/schema/49_queries_updates.sql, and step_wait (47_waits.sql), which makes a
-- node that suspends with an update not applied yet available at once.

-- Queries and updates of durable functions (docs/durable-functions.md, "Queries and
-- updates"). A query is answered by the worker running the node's body (run_queries:
-- asked, delivered to the worker by WorkerService.Inbox, answered there) or, when no
-- worker runs it, from the values its query handlers last published (query_state). An
-- update is kept in run_updates until the body applies it: the body records the
-- application as an entry of its journal, step_id 'update:<update_id>', function
-- cyclone.update, so that a replay applies it again at the same point and the queue
-- never hands it out twice.

-- One question to the worker running a node, from QueryRun: asked, handed out once
-- (delivered_at), answered (answered_at, with result or error {type, message}). The
-- server that asked deletes the row once answered or timed out. Keyed by run_id first,
-- as every run-level table (shard-ready for Citus).
CREATE TABLE cyclone.run_queries (
    query_id     bigint      GENERATED ALWAYS AS IDENTITY,
    run_id       uuid        NOT NULL,
    node         text        COLLATE "C" NOT NULL,
    name         text        NOT NULL,
    args         jsonb       NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    delivered_at timestamptz,
    answered_at  timestamptz,
    result       jsonb,
    error        jsonb,
    PRIMARY KEY (run_id, query_id),
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE
);

CREATE INDEX run_queries_waiting_idx ON cyclone.run_queries (run_id, node)
    WHERE delivered_at IS NULL;

-- The value each query handler of a body (those that take no arguments) had at the
-- body's last journal point, as its worker published it: what QueryRun answers when
-- no worker runs the node.
CREATE TABLE cyclone.query_state (
    run_id       uuid        NOT NULL,
    node         text        COLLATE "C" NOT NULL,
    name         text        COLLATE "C" NOT NULL,
    value        jsonb       NOT NULL,
    attempt      integer     NOT NULL,
    published_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, node, name),
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE
);

-- An update sent to a node (UpdateRun), unique by its id: kept until the body applies
-- it (the journal entry 'update:<update_id>' is its outcome). seq orders the updates
-- of a node for delivery (WorkerService.Inbox hands out those past a cursor).
CREATE TABLE cyclone.run_updates (
    run_id     uuid        NOT NULL,
    node       text        COLLATE "C" NOT NULL,
    update_id  text        COLLATE "C" NOT NULL,
    seq        bigint      GENERATED ALWAYS AS IDENTITY,
    name       text        NOT NULL,
    args       jsonb       NOT NULL,
    created_at timestamptz NOT NULL,
    created_by text        NOT NULL,
    PRIMARY KEY (run_id, node, update_id),
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE
);

CREATE INDEX run_updates_seq_idx ON cyclone.run_updates (run_id, node, seq);

-- Sends an update to a node: recorded, unless its id was sent before (then created =
-- false and the first update's name and args are returned, nothing changes). CY002 for
-- an unknown run or node; CY003 when the run is completed, failed or cancelled, or the
-- node is finished. A node that waits (a sleep, an event, a child) is woken: available
-- now, its action notified, so that its body replays to the wait and applies the
-- update there. Audited (action update). The name cyclone.inbox:<run_id> is made
-- ready: no action has it, and the Inbox calls of the run's workers wait for it.
-- RPC: UpdateRun.
CREATE FUNCTION cyclone.update_send(p_run_id uuid, p_node text, p_update_id text,
                                    p_name text, p_args jsonb, p_actor text)
RETURNS TABLE (created boolean, name text, args jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text;
    v_step   text;
    v_action text;
    v_found  cyclone.run_updates;
BEGIN
    v_status := cyclone._run_lock(p_run_id);
    SELECT * INTO v_found FROM cyclone.run_updates u
     WHERE u.run_id = p_run_id AND u.node = p_node AND u.update_id = p_update_id;
    IF FOUND THEN
        RETURN QUERY SELECT false, v_found.name, v_found.args;
        RETURN;
    END IF;
    SELECT s.status, s.action INTO v_step, v_action FROM cyclone.steps s
     WHERE s.run_id = p_run_id AND s.node = p_node;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % has no node %', p_run_id, p_node USING ERRCODE = 'CY002';
    END IF;
    IF v_status IN ('completed', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'run % is %: it takes no more updates', p_run_id, v_status
            USING ERRCODE = 'CY003';
    END IF;
    IF v_action LIKE 'cyclone.%' THEN
        RAISE EXCEPTION 'node % of run % is served by the server (%), not by a durable '
            'function: it takes no updates', p_node, p_run_id, v_action USING ERRCODE = 'CY003';
    END IF;
    IF v_step IN ('completed', 'discarded', 'skipped', 'cancelled') THEN
        RAISE EXCEPTION 'node % of run % is %: it takes no more updates', p_node, p_run_id,
            v_step USING ERRCODE = 'CY003';
    END IF;
    INSERT INTO cyclone.run_updates AS u (run_id, node, update_id, name, args, created_at,
                                          created_by)
    VALUES (p_run_id, p_node, p_update_id, p_name, coalesce(p_args, '[]'::jsonb), v_now,
            p_actor);
    INSERT INTO cyclone.audit (run_id, node, action, actor, details, at)
    VALUES (p_run_id, p_node, 'update', p_actor,
            jsonb_build_object('name', p_name, 'update_id', p_update_id), v_now);
    v_action := NULL;
    UPDATE cyclone.steps s SET available_at = v_now
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'available'
       AND s.waiting_for IS NOT NULL AND s.available_at > v_now
    RETURNING s.action INTO v_action;
    -- The workers running the node hear of it (WorkerService.Inbox waits for this
    -- name); a woken node's action is made ready.
    PERFORM cyclone._notify_ready(array_remove(ARRAY['cyclone.inbox:' || p_run_id, v_action],
                                               NULL));
    RETURN QUERY SELECT true, p_name, coalesce(p_args, '[]'::jsonb);
END;
$$;

-- A wait that suspends the node: available at once when an update waits (47_waits.sql).
CREATE OR REPLACE FUNCTION cyclone.step_wait(
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
