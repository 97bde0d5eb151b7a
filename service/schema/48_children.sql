-- Child runs: a durable function starts a run of another workflow as a step call of
-- its body (StartChild), waits for its outcome (Wait with child_run_id: child_wait,
-- _wait_child), is woken when the child finishes (_child_finished, 10_internals.sql, from _runs_close
-- and run_cancel), and the parent's cancel reaches its children (run_cancel,
-- 70_operator.sql). A child is an ordinary run with a parent link (runs.parent_run_id,
-- parent_node, parent_step_id); the step call that started it is its idempotency key.
--
-- Locks, in the one order every path takes them: a parent's run, then its children's
-- runs (run_cancel, child_wait); a run, then its own steps, then its parent's node
-- (a child that finishes). So a child's finish and its parent's wait or cancel never
-- wait on each other in a cycle.

-- Starts a child run from the held step (run_id, node) as its step call p_step_id
-- (function cyclone.start_child), in one transaction: the child is submitted (run_submit,
-- p_nodes validated by the server as for Submit) with its parent link, and the call
-- recorded succeeded with the output {"run_id": child}; the child keeps its parent's
-- traceparent, so one trace holds both. When the call is recorded
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
    v_trace   text;
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
    -- The child continues its parent's trace (docs/tracing.md): read first, as Citus
    -- takes no subquery in run_submit's INSERT.
    SELECT r.traceparent INTO v_trace FROM cyclone.runs r WHERE r.run_id = p_run_id;
    PERFORM cyclone.run_submit(p_child_run_id, p_workflow, NULL, p_input, p_nodes,
                               p_traceparent => v_trace);
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
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cyclone.steps s SET status = 'cancelled', finished_at = p_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.status IN ('pending', 'available', 'running', 'uncertain');
    UPDATE cyclone.runs r
       SET status = 'cancelled', steps_open = 0, error = NULL, finished_at = p_now,
           updated_at = p_now
     WHERE r.run_id = p_run_id;
    INSERT INTO cyclone.audit (run_id, action, actor, reason, details, at)
    VALUES (p_run_id, 'cancel', p_actor, p_reason, p_details, p_now);
END;
$$;

-- The outcome of the wait of node p_node of run p_run_id for its child p_child (the
-- caller, child_wait, holds the child's row share-locked): NULL while the child is
-- running or blocked; {"output": {"run_id", "status": "completed", "outputs": {node:
-- output}}} (its completed nodes) once it completed; {"error": {type ChildFailed or
-- ChildCancelled, message, details}} once it failed (with its error) or was cancelled
-- (with the cancel's reason). CY004 for a run that this node did not start (or no
-- run at all). Called by step_wait (47_waits.sql) for a wait of function
-- cyclone.child; replaces the placeholder 47_waits.sql defines.
CREATE OR REPLACE FUNCTION cyclone._wait_child(p_run_id uuid, p_node text, p_step_id text,
                                               p_child uuid)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_child record;
BEGIN
    SELECT r.status, r.workflow, r.error, r.parent_run_id, r.parent_node INTO v_child
      FROM cyclone.runs r WHERE r.run_id = p_child;
    IF NOT FOUND OR v_child.parent_run_id IS DISTINCT FROM p_run_id
       OR v_child.parent_node IS DISTINCT FROM p_node THEN
        RAISE EXCEPTION 'run % is not a child run started by node % of run %', p_child,
            left(p_node, 200), p_run_id USING ERRCODE = 'CY004';
    END IF;
    CASE v_child.status
    WHEN 'completed' THEN
        RETURN jsonb_build_object('output', jsonb_build_object(
            'run_id', p_child, 'status', 'completed',
            'outputs', (SELECT coalesce(jsonb_object_agg(s.node, s.output), '{}')
                          FROM cyclone.steps s
                         WHERE s.run_id = p_child AND s.status = 'completed')));
    WHEN 'failed' THEN
        RETURN jsonb_build_object('error', jsonb_build_object(
            'type', 'ChildFailed',
            'message', format('child run %s (workflow %s) failed: %s', p_child,
                              v_child.workflow, v_child.error->>'message'),
            'details', v_child.error::text));
    WHEN 'cancelled' THEN
        RETURN jsonb_build_object('error', jsonb_build_object(
            'type', 'ChildCancelled',
            'message', format('child run %s (workflow %s) was cancelled%s', p_child,
                              v_child.workflow,
                              (SELECT ': ' || nullif(a.reason, '') FROM cyclone.audit a
                                WHERE a.run_id = p_child AND a.action = 'cancel'
                                ORDER BY a.id DESC LIMIT 1)),
            'details', ''));
    ELSE
        RETURN NULL;
    END CASE;
END;
$$;

-- Wait for a child run's outcome (Wait with child_run_id): step_wait with function
-- cyclone.child, after taking the parent run's lock and then a share lock of the
-- child's row, in that order. A child that finishes locks its own run before it wakes
-- its parent's node (_child_finished), and run_cancel locks a parent before its
-- children: so this wait either sees the child finished, or is committed, node
-- waiting, before the child's finish looks for it; and no two of them wait on each
-- other. RPC: Wait (child_run_id).
CREATE FUNCTION cyclone.child_wait(p_run_id uuid, p_node text, p_lease_token uuid,
                                   p_step_id text, p_seq integer, p_child uuid)
RETURNS TABLE (decision text, call jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cyclone._run_lock(p_run_id);
    PERFORM 1 FROM cyclone.runs r WHERE r.run_id = p_child FOR SHARE;
    RETURN QUERY SELECT * FROM cyclone.step_wait(p_run_id, p_node, p_lease_token, p_step_id,
                                                 p_seq, 'cyclone.child', NULL, NULL, NULL,
                                                 p_child);
END;
$$;
