-- Child runs (issue 16): a durable function starts a run of another workflow as a step
-- call of its body, and cancelling a run cancels its children.
--   runs.parent_run_id, parent_node, parent_step_id   the link of a child run
--   runs_parent_idx                                   a run's children
--   child_start                                       StartChild
--   _run_cancel_one, run_cancel                       cancel, down the tree unless
--                                                     p_keep_children

ALTER TABLE cyclone.runs
    ADD COLUMN parent_run_id uuid,
    ADD COLUMN parent_node text,
    ADD COLUMN parent_step_id text;
CREATE INDEX runs_parent_idx ON cyclone.runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

-- Starts a child run from the held step (run_id, node) as its step call p_step_id
-- (function cyclone.start_child), in one transaction: the child is submitted (run_submit,
-- p_nodes validated by the server as for Submit) with its parent link, and the call
-- recorded succeeded with the output {"run_id": child}. When the call is recorded
-- already, nothing is submitted and the recorded child is answered (created = false):
-- a replay, or a repeated call, never starts a second child. The parent's run lock is
-- taken first, as run_cancel takes it: a cancel of the parent either finds the child
-- or makes this call's lease check fail. CY001 when the lease is lost, CY004 for a bad
-- identity, CY003 when p_step_id is recorded for another function or past the
-- journal's limit. RPC: StartChild.
CREATE FUNCTION cyclone.child_start(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_child_run_id uuid, p_workflow text, p_input jsonb, p_nodes jsonb)
RETURNS TABLE (child_run_id uuid, created boolean, call jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_attempt integer;
    v_call    cyclone.step_calls;
BEGIN
    PERFORM cyclone._step_call_check(p_step_id, p_seq, 'cyclone.start_child');
    PERFORM cyclone._run_lock(p_run_id);
    v_attempt := cyclone._step_held(p_run_id, p_node, p_lease_token, true);
    SELECT * INTO v_call FROM cyclone.step_calls c
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id;
    IF FOUND THEN
        IF v_call.function <> 'cyclone.start_child' OR v_call.status <> 'succeeded' THEN
            RAISE EXCEPTION 'step call % of node % is recorded for function % (%), not as '
                            'a child run', p_step_id, p_node, v_call.function, v_call.status
                USING ERRCODE = 'CY003';
        END IF;
        RETURN QUERY SELECT (v_call.output->>'run_id')::uuid, false,
                            cyclone._step_call_json(v_call);
        RETURN;
    END IF;
    PERFORM cyclone._step_call_room(p_run_id, p_node);
    INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                         unsafe, output, attempt, started_at, finished_at)
    VALUES (p_run_id, p_node, p_step_id, p_seq, 'cyclone.start_child', 'succeeded', false,
            jsonb_build_object('run_id', p_child_run_id), v_attempt, v_now, v_now)
    RETURNING c.* INTO v_call;
    PERFORM cyclone.run_submit(p_child_run_id, p_workflow, NULL, p_input, p_nodes);
    UPDATE cyclone.runs r
       SET parent_run_id = p_run_id, parent_node = p_node, parent_step_id = p_step_id
     WHERE r.run_id = p_child_run_id;
    RETURN QUERY SELECT p_child_run_id, true, cyclone._step_call_json(v_call);
END;
$$;

-- Cancels one run whose row the caller has locked (not completed nor cancelled): its
-- unfinished steps become cancelled, the run cancelled with its error cleared, and an
-- audit entry (action cancel) records p_actor, p_reason and p_details. Called by
-- run_cancel, for the run it was asked to cancel and for each of its descendants.
CREATE FUNCTION cyclone._run_cancel_one(p_run_id uuid, p_actor text, p_reason text,
                                        p_details jsonb, p_now timestamptz)
RETURNS void
LANGUAGE sql AS $$
    UPDATE cyclone.steps s SET status = 'cancelled', finished_at = p_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.status IN ('pending', 'available', 'running', 'uncertain');
    UPDATE cyclone.runs r
       SET status = 'cancelled', steps_open = 0, error = NULL, finished_at = p_now,
           updated_at = p_now
     WHERE r.run_id = p_run_id;
    INSERT INTO cyclone.audit (run_id, action, actor, reason, details, at)
    VALUES (p_run_id, 'cancel', p_actor, p_reason, p_details, p_now);
$$;

DROP FUNCTION cyclone.run_cancel(uuid, text, text);

-- Cancels a run: every unfinished step becomes cancelled (a running handler learns it
-- from its next heartbeat, and its completion is refused), and the run's error is
-- cleared (_run_cancel_one). Unless p_keep_children, every descendant run (its child
-- runs, theirs, ...) that is running or blocked is cancelled with it, each with its own
-- audit entry naming the run whose cancel reached it. The descendants are locked
-- first, level by level from the top and each level in run_id order, before any step
-- changes: a locked run starts no child (child_start takes its run's lock), so each
-- level is complete once the one above is locked; and a child finishing meanwhile,
-- which locks its own run before it touches its parent's node, never waits on a lock
-- held here. CY003 when the run is already completed or cancelled. RPC: CancelRun.
CREATE FUNCTION cyclone.run_cancel(p_run_id uuid, p_actor text, p_reason text,
                                   p_keep_children boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_level  uuid[] := ARRAY[p_run_id];
    v_tree   uuid[] := '{}';
    v_child  record;
BEGIN
    IF v_status IN ('completed', 'cancelled') THEN
        RAISE EXCEPTION 'run % is already %', p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    IF NOT p_keep_children THEN
        LOOP
            SELECT coalesce(array_agg(t.run_id), '{}') INTO v_level
              FROM (SELECT r.run_id FROM cyclone.runs r
                     WHERE r.parent_run_id = ANY (v_level)
                     ORDER BY r.run_id FOR NO KEY UPDATE) t;
            EXIT WHEN cardinality(v_level) = 0;
            v_tree := v_tree || v_level;
        END LOOP;
    END IF;
    PERFORM cyclone._run_cancel_one(p_run_id, p_actor, coalesce(p_reason, ''),
                                    jsonb_build_object('previous_status', v_status,
                                                       'keep_children', p_keep_children),
                                    v_now);
    FOR v_child IN
        SELECT r.run_id, r.status FROM cyclone.runs r
         WHERE r.run_id = ANY (v_tree) AND r.status IN ('running', 'blocked')
         ORDER BY r.run_id
    LOOP
        PERFORM cyclone._run_cancel_one(
            v_child.run_id, p_actor,
            concat('run ', p_run_id, ' was cancelled', ': ' || nullif(p_reason, '')),
            jsonb_build_object('previous_status', v_child.status, 'cancelled_with', p_run_id),
            v_now);
    END LOOP;
END;
$$;
