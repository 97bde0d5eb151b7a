-- A child run keeps its parent's traceparent.

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
CREATE OR REPLACE FUNCTION cyclone.child_start(
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
