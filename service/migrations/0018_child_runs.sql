-- Child runs: a durable function starts a run of another workflow as a step
-- call of its body, waits for its outcome, and cancelling a run cancels its children.
--   runs.parent_run_id, parent_node, parent_step_id   the link of a child run
--   runs_parent_idx                                   a run's children
--   child_start                                       StartChild
--   child_wait, _wait_child                           Wait with child_run_id (the latter
--                                                     replaces 0017's placeholder)
--   _child_finished, _runs_close                      a finished child wakes its parent
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

-- A child run p_run_id of p_parent just finished (completed, failed or cancelled, its
-- status p_status, returned): the parent's node waiting for it is woken
-- (_wake_waiting, "child <run_id>"). The caller holds the child's run lock, not its
-- parent's (child_wait, 48_children.sql, says why none is taken). Called by
-- _runs_close and run_cancel.
CREATE FUNCTION cyclone._child_finished(p_run_id uuid, p_parent uuid, p_status text)
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cyclone._wake_waiting(p_parent, 'child ' || p_run_id);
    RETURN p_status;
END;
$$;

-- Closes runs by counts: each run's steps_open goes down by the number of its steps
-- that became final; a running run left with none open is completed, or failed with
-- a StepDiscarded error naming its first discarded step. A child run that finishes so
-- wakes its parent's node when it waits for it (_child_finished, called for those
-- runs only). Returns each run's status. Runs are found by primary key, and the
-- discarded-step checks are scalar lookups through steps_discarded_idx, so no plan
-- scans steps. Called by _run_close and by step_complete_many (runs whose completed
-- steps have no dependents).
CREATE OR REPLACE FUNCTION cyclone._runs_close(p_runs uuid[], p_closed integer[],
                                               p_now timestamptz)
RETURNS TABLE (run_id uuid, status text)
LANGUAGE sql AS $$
    WITH closed AS (
        UPDATE cyclone.runs r
           SET steps_open = r.steps_open - c.closed,
               updated_at = p_now,
               status = CASE
                   WHEN r.steps_open > c.closed OR r.status <> 'running' THEN r.status
                   WHEN (SELECT true FROM cyclone.steps s
                          WHERE s.run_id = r.run_id AND s.status = 'discarded' LIMIT 1)
                   THEN 'failed'
                   ELSE 'completed' END,
               finished_at = CASE
                   WHEN r.steps_open > c.closed OR r.status <> 'running' THEN r.finished_at
                   ELSE p_now END,
               error = CASE
                   WHEN r.steps_open > c.closed OR r.status <> 'running' THEN r.error
                   ELSE (SELECT jsonb_build_object(
                                    'kind', 'StepDiscarded',
                                    'message', format('node %s was discarded at attempt %s',
                                                      s.node, s.attempt),
                                    'node', s.node, 'attempt', s.attempt,
                                    'started_at', s.started_at)
                           FROM cyclone.steps s
                          WHERE s.run_id = r.run_id AND s.status = 'discarded'
                          ORDER BY s.finished_at, s.node LIMIT 1) END
          FROM unnest(p_runs, p_closed) AS c(run_id, closed)
         WHERE r.run_id = c.run_id AND r.run_id = ANY (p_runs)
        RETURNING r.run_id, r.status, r.parent_run_id, r.finished_at)
    -- CASE evaluates its branch only when taken: runs without a parent, and runs
    -- that did not finish here, cost nothing more.
    SELECT c.run_id,
           CASE WHEN c.parent_run_id IS NOT NULL AND c.finished_at = p_now
                THEN cyclone._child_finished(c.run_id, c.parent_run_id, c.status)
                ELSE c.status END
      FROM closed c
$$;

DROP FUNCTION cyclone.run_cancel(uuid, text, text);

-- Cancels a run: every unfinished step becomes cancelled (a running handler learns it
-- from its next heartbeat, and its completion is refused), and the run's error is
-- cleared (_run_cancel_one); a parent node waiting for it is woken
-- (_child_finished). Unless p_keep_children, every descendant run (its child runs,
-- theirs, ...) that is running or blocked is cancelled with it, each with its own audit
-- entry naming the run whose cancel reached it. The descendants are locked first,
-- level by level from the top and each level in run_id order, before any step
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
    -- A child cancelled on its own: its parent may wait for it.
    PERFORM cyclone._child_finished(r.run_id, r.parent_run_id, r.status)
       FROM cyclone.runs r WHERE r.run_id = p_run_id AND r.parent_run_id IS NOT NULL;
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
