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
    v_started timestamptz;
    v_at     timestamptz;
BEGIN
    v_status := cyclone._run_lock(p_run_id);
    SELECT * INTO v_found FROM cyclone.run_updates u
     WHERE u.run_id = p_run_id AND u.node = p_node AND u.update_id = p_update_id;
    IF FOUND THEN
        RETURN QUERY SELECT false, v_found.name, v_found.args;
        RETURN;
    END IF;
    -- The node's row, locked: a claim of it under way is committed first, so that the
    -- attempt read here is the one running when the update is recorded.
    SELECT s.status, s.action, s.started_at INTO v_step, v_action, v_started
      FROM cyclone.steps s
     WHERE s.run_id = p_run_id AND s.node = p_node
       FOR NO KEY UPDATE;
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
    -- Sent during the running attempt: later than its start, even when this statement
    -- began before the claim that started it (step_wait counts the updates sent since
    -- the attempt started and not applied, and wakes the node for them).
    v_at := CASE WHEN v_step = 'running' AND v_started >= v_now
                 THEN v_started + interval '1 microsecond' ELSE v_now END;
    INSERT INTO cyclone.run_updates AS u (run_id, node, update_id, name, args, created_at,
                                          created_by)
    VALUES (p_run_id, p_node, p_update_id, p_name, coalesce(p_args, '[]'::jsonb), v_at,
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
