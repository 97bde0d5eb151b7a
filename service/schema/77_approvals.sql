-- Approvals by token: a durable function asks a person for a decision through a
-- one-time URL (POST /callbacks/<token> on the server's HTTP listener, or the console's
-- Approve and Reject). The body's approval call creates the approval (CreateApproval,
-- fenced by the node's lease); the body then waits for the event `approval:<id>`,
-- which approval_decide sends, once. Only the SHA-256 of a token is stored.

-- One approval per approval call of a node's journal (run, node, step_id). Deleted
-- with its run.
CREATE TABLE cyclone.approvals (
    run_id       uuid        NOT NULL REFERENCES cyclone.runs ON DELETE CASCADE,
    approval_id  uuid        NOT NULL,
    -- SHA-256 of the token; the token itself is given out once and never stored. Not a
    -- unique constraint (with runs sharded by run_id one could not span the shards):
    -- 256 random bits do not collide.
    token_sha256 bytea       NOT NULL CHECK (length(token_sha256) = 32),
    node         text        NOT NULL,
    step_id      text        NOT NULL,
    -- What is asked, as the body gave it (shown by the console).
    title        text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    -- Once decided: when, by whom (the actor: "callback" for the URL, the console's
    -- user), and the payload the wait got.
    decided_at   timestamptz,
    decided_by   text,
    decision     jsonb,
    PRIMARY KEY (run_id, approval_id),
    UNIQUE (run_id, node, step_id),
    CONSTRAINT approvals_decided_together
        CHECK ((decided_at IS NULL) = (decided_by IS NULL)
               AND (decided_by IS NULL) = (decision IS NULL))
);
-- A callback finds its approval by the token's hash; DecideApproval by its id.
CREATE INDEX approvals_token_idx ON cyclone.approvals (token_sha256);
CREATE INDEX approvals_id_idx ON cyclone.approvals (approval_id);
-- The pending approvals, newest first (the console's list).
CREATE INDEX approvals_pending_idx ON cyclone.approvals (created_at)
    WHERE decided_at IS NULL;

-- Creates the approval of an approval call, fenced by the node's lease (CY001; the
-- run locked first): p_approval_id and the SHA-256 of a fresh token, valid for p_ttl
-- (1 second to 366 days, else CY004). A call made again (its attempt was lost before
-- its outcome was recorded) keeps the approval's id and replaces its token, expiry and
-- title, so that only the newest token works; once the approval is decided nothing
-- changes (decided = true: the body's wait finds the decision). Returns the
-- approval's id, its expiry and whether it is decided. RPC: CreateApproval.
CREATE FUNCTION cyclone.approval_create(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_approval_id uuid,
    p_token_sha256 bytea, p_ttl interval, p_title text)
RETURNS TABLE (approval_id uuid, expires_at timestamptz, decided boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := cyclone.now();
    v_row cyclone.approvals;
BEGIN
    IF p_ttl IS NULL OR p_ttl < interval '1 second' OR p_ttl > interval '366 days' THEN
        RAISE EXCEPTION 'an approval''s timeout must be between 1s and 366 days, got %',
            p_ttl USING ERRCODE = 'CY004';
    END IF;
    IF p_step_id IS NULL OR length(p_step_id) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'an approval needs the step id of its call' USING ERRCODE = 'CY004';
    END IF;
    PERFORM cyclone._run_lock(p_run_id);
    PERFORM cyclone._step_held(p_run_id, p_node, p_lease_token, true);
    SELECT * INTO v_row FROM cyclone.approvals a
     WHERE a.run_id = p_run_id AND a.node = p_node AND a.step_id = p_step_id
       FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO cyclone.approvals AS a (approval_id, token_sha256, run_id, node, step_id,
                                            title, created_at, expires_at)
        VALUES (p_approval_id, p_token_sha256, p_run_id, p_node, p_step_id,
                coalesce(p_title, ''), v_now, v_now + p_ttl)
        RETURNING a.* INTO v_row;
    ELSIF v_row.decided_at IS NULL THEN
        UPDATE cyclone.approvals a
           SET token_sha256 = p_token_sha256, title = coalesce(p_title, ''),
               expires_at = v_now + p_ttl
         WHERE a.run_id = p_run_id AND a.approval_id = v_row.approval_id
        RETURNING a.* INTO v_row;
    END IF;
    RETURN QUERY SELECT v_row.approval_id, v_row.expires_at, v_row.decided_at IS NOT NULL;
END;
$$;

-- Decides an approval once: found by the SHA-256 of its token (p_token_sha256, the
-- HTTP callback) or by its id (p_approval_id, the console). The run is locked first,
-- then the approval row, so that concurrent calls decide it once. Outcomes:
--   decided          this call decided it: the event approval:<id> is sent to the run
--                    with p_payload (event_send, which wakes the waiting node), the
--                    approval records who and what, and the run's audit trail an
--                    entry decide_approval with p_actor;
--   already_decided  it was decided before (decided_at, decided_by say when and who);
--   expired          its expiry has passed;
--   finished         its run is completed or cancelled;
--   unknown          no such token or id (a forged token, or one replaced by a newer
--                    call).
-- Nothing is written but for decided.
CREATE FUNCTION cyclone.approval_decide(p_token_sha256 bytea, p_approval_id uuid,
                                        p_payload jsonb, p_actor text)
RETURNS TABLE (outcome text, approval_id uuid, run_id uuid, decided_at timestamptz,
               decided_by text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_run    uuid;
    v_status text;
    v_row    cyclone.approvals;
BEGIN
    SELECT a.run_id INTO v_run FROM cyclone.approvals a
     WHERE (p_token_sha256 IS NOT NULL AND a.token_sha256 = p_token_sha256)
        OR (p_token_sha256 IS NULL AND a.approval_id = p_approval_id);
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown', NULL::uuid, NULL::uuid, NULL::timestamptz, NULL::text;
        RETURN;
    END IF;
    v_status := cyclone._run_lock(v_run);
    SELECT * INTO v_row FROM cyclone.approvals a
     WHERE a.run_id = v_run
       AND ((p_token_sha256 IS NOT NULL AND a.token_sha256 = p_token_sha256)
            OR (p_token_sha256 IS NULL AND a.approval_id = p_approval_id))
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown', NULL::uuid, NULL::uuid, NULL::timestamptz, NULL::text;
        RETURN;
    END IF;
    IF v_row.decided_at IS NOT NULL THEN
        RETURN QUERY SELECT 'already_decided', v_row.approval_id, v_row.run_id,
                            v_row.decided_at, v_row.decided_by;
        RETURN;
    END IF;
    IF v_row.expires_at <= v_now THEN
        RETURN QUERY SELECT 'expired', v_row.approval_id, v_row.run_id, NULL::timestamptz,
                            NULL::text;
        RETURN;
    END IF;
    IF v_status IN ('completed', 'cancelled') THEN
        RETURN QUERY SELECT 'finished', v_row.approval_id, v_row.run_id, NULL::timestamptz,
                            NULL::text;
        RETURN;
    END IF;
    PERFORM cyclone.event_send(v_row.run_id, 'approval:' || v_row.approval_id,
                               coalesce(p_payload, 'null'::jsonb),
                               'approval:' || v_row.approval_id, p_actor);
    UPDATE cyclone.approvals a
       SET decided_at = v_now, decided_by = p_actor, decision = coalesce(p_payload, 'null')
     WHERE a.run_id = v_row.run_id AND a.approval_id = v_row.approval_id;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (v_row.run_id, v_row.node, 'decide_approval', p_actor,
            left(coalesce(p_payload->>'comment', ''), 1000),
            jsonb_build_object('approval_id', v_row.approval_id, 'node', v_row.node,
                               'step_id', v_row.step_id,
                               'approved', coalesce(p_payload, 'null')->'approved'),
            v_now);
    RETURN QUERY SELECT 'decided', v_row.approval_id, v_row.run_id, v_now, p_actor;
END;
$$;
