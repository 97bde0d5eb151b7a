-- Pause and resume: of one run (run_pause, run_resume), and of a workflow or an action
-- across every run (pause_set, pause_clear).
--
-- A paused run keeps its status (running or blocked) and gets paused_at, paused_by and
-- pause_reason. Pausing takes its available steps out of what a claim reads: they
-- become pending, the time each is due kept in available_at. Every transition that
-- would make one of its steps available holds it pending instead, by the same test
-- (_settle, step_fail, sweep_steps, steps_release, step_wait, step_resolve,
-- step_call_resolve); running steps go on, complete, fail and heartbeat as usual, and
-- waits still resolve (_wake_waiting brings a held wait's time forward). Resuming
-- makes the held steps available again, at the time each was due, and wakes the claims
-- of their actions. So the claim itself reads nothing about run pauses.
--
-- A paused workflow or action is a row of cyclone.pauses, which the claim's pick reads
-- (step_claim, step_candidates_sharded): no step of that action, or of a run of that
-- workflow, is handed out while it is there.

-- Pauses a running or blocked run (see above) for p_actor, with p_reason (audited:
-- "pause", with how many steps it held). Returns whether it changed anything: false
-- when the run was paused already (nothing is written then). CY002 for an unknown run,
-- CY003 for a finished one. RPC: PauseRun.
CREATE FUNCTION cyclone.run_pause(p_run_id uuid, p_actor text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_held   integer;
BEGIN
    IF v_status NOT IN ('running', 'blocked') THEN
        RAISE EXCEPTION 'run % is %: only a running or blocked run can be paused',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    IF (SELECT r.paused_at IS NOT NULL FROM cyclone.runs r WHERE r.run_id = p_run_id) THEN
        RETURN false;
    END IF;
    UPDATE cyclone.runs r
       SET paused_at = v_now, paused_by = p_actor, pause_reason = coalesce(p_reason, '')
     WHERE r.run_id = p_run_id;
    UPDATE cyclone.steps s SET status = 'pending'
     WHERE s.run_id = p_run_id AND s.status = 'available';
    GET DIAGNOSTICS v_held = ROW_COUNT;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, '', 'pause', p_actor, coalesce(p_reason, ''),
            jsonb_build_object('held', v_held, 'status', v_status), v_now);
    RETURN true;
END;
$$;

-- Resumes a paused run: the pause is cleared and, when the run is running, the steps
-- held while it was paused become available at the time each was due (at once when
-- that has passed), their actions notified; a blocked run keeps them held until
-- Resolve. Audited ("resume", with how many steps it released). Returns whether it
-- changed anything: false when the run was not paused. CY002 for an unknown run.
-- RPC: ResumeRun.
CREATE FUNCTION cyclone.run_resume(p_run_id uuid, p_actor text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_status  text := cyclone._run_lock(p_run_id);
    v_actions text[] := '{}';
BEGIN
    IF (SELECT r.paused_at IS NULL FROM cyclone.runs r WHERE r.run_id = p_run_id) THEN
        RETURN false;
    END IF;
    UPDATE cyclone.runs r SET paused_at = NULL, paused_by = NULL, pause_reason = NULL
     WHERE r.run_id = p_run_id;
    IF v_status = 'running' THEN
        WITH released AS (
            UPDATE cyclone.steps s
               SET status = 'available', available_at = coalesce(s.available_at, v_now)
             WHERE s.run_id = p_run_id AND s.status = 'pending' AND s.deps_open = 0
            RETURNING s.action)
        SELECT coalesce(array_agg(DISTINCT action), '{}') INTO v_actions FROM released;
        PERFORM cyclone._notify_ready(v_actions);
    END IF;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, '', 'resume', p_actor, coalesce(p_reason, ''),
            jsonb_build_object('actions', to_jsonb(v_actions), 'status', v_status), v_now);
    RETURN true;
END;
$$;

-- Pauses a workflow or an action (p_kind 'workflow' or 'action') for p_actor, with
-- p_reason: from this commit on no claim hands out a step of it. Logged in
-- cyclone.pause_log. Returns whether it changed anything (false: paused already; the
-- first pause's actor and reason stand). CY004 for an unknown kind or a name no
-- workflow or action can have (1 to 200 characters, none a control character).
-- RPC: PauseName.
CREATE FUNCTION cyclone.pause_set(p_kind text, p_name text, p_actor text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    PERFORM cyclone._pause_check(p_kind, p_name);
    INSERT INTO cyclone.pauses AS p (kind, name, actor, reason, at)
    VALUES (p_kind, p_name, p_actor, coalesce(p_reason, ''), v_now)
        ON CONFLICT (kind, name) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO cyclone.pause_log (kind, name, action, actor, reason, at)
    VALUES (p_kind, p_name, 'pause', p_actor, coalesce(p_reason, ''), v_now);
    RETURN true;
END;
$$;

-- Resumes a paused workflow or action: its steps are claimable again, and the claims
-- of the actions concerned are woken (an action's own; every action for a workflow).
-- Logged in cyclone.pause_log. Returns whether it changed anything (false: it was not
-- paused). CY004 as pause_set. RPC: ResumeName.
CREATE FUNCTION cyclone.pause_clear(p_kind text, p_name text, p_actor text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    PERFORM cyclone._pause_check(p_kind, p_name);
    DELETE FROM cyclone.pauses p WHERE p.kind = p_kind AND p.name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO cyclone.pause_log (kind, name, action, actor, reason, at)
    VALUES (p_kind, p_name, 'resume', p_actor, coalesce(p_reason, ''), v_now);
    -- A workflow's runs may have steps of any action: the waiting claims of every
    -- action the servers know of look again (a claim woken for nothing waits again).
    PERFORM cyclone._notify_ready(CASE WHEN p_kind = 'action' THEN ARRAY[p_name]
                                       ELSE ARRAY(SELECT a.action FROM cyclone.action_claims a)
                                  END);
    RETURN true;
END;
$$;

-- Refuses what pause_set and pause_clear cannot name: CY004.
CREATE FUNCTION cyclone._pause_check(p_kind text, p_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('workflow', 'action') THEN
        RAISE EXCEPTION 'unknown kind of pause %: workflow or action', left(p_kind, 50)
            USING ERRCODE = 'CY004';
    END IF;
    IF p_name IS NULL OR char_length(p_name) NOT BETWEEN 1 AND 200
       OR p_name ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'a % name is 1 to 200 characters, none a control character', p_kind
            USING ERRCODE = 'CY004';
    END IF;
END;
$$;
