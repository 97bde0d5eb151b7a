-- What an operator needs to see why a step is not running (Explain), and what the
-- server needs for its metrics and logs, at no cost to the claim's plan.
--
--   steps.last_heartbeat_at  when the holder of the lease last showed signs of life:
--                            set by step_claim and step_heartbeat
--   action_claims            per action, the last Claim that asked for it and the last
--                            one that got a step of it; written by each server from
--                            memory every few seconds (service/activity.py), never by
--                            the claim itself
--   step_claim               also returns waited_s: how long the step was ready before
--                            this claim took it (the claim-wait histogram)
--   sweep_steps              the sweep, returning the steps it reclaimed, so that each
--                            expired lease is logged with its run, node and attempt

ALTER TABLE cyclone.steps ADD COLUMN last_heartbeat_at timestamptz;

CREATE TABLE cyclone.action_claims (
    action     text        PRIMARY KEY,
    -- Last Claim that named this action (a worker serving it asked for work), and who.
    polled_at  timestamptz NOT NULL,
    polled_by  text        NOT NULL,
    -- Last Claim that handed out a step of this action, and to whom.
    claimed_at timestamptz,
    claimed_by text,
    CONSTRAINT action_claims_claimed_by_iff_claimed
        CHECK ((claimed_at IS NULL) = (claimed_by IS NULL))
);

-- As in 0002, and also: last_heartbeat_at is the claim time, and each row says how
-- long the step had been ready (waited_s).
DROP FUNCTION cyclone.step_claim(text, text[], text[], integer, interval);
CREATE FUNCTION cyclone.step_claim(
    p_worker text, p_actions text[], p_unsafe text[], p_limit integer, p_lease interval)
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    IF cardinality(p_unsafe) > 0 THEN
        RETURN QUERY SELECT b.run_id, b.node, b.action, b.workflow, b.attempt, b.max_attempts,
                            NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::uuid,
                            NULL::timestamptz, NULL::timestamptz, NULL::jsonb, true, true,
                            NULL::float8
                       FROM cyclone._block_uncertain(p_unsafe) b;
    END IF;

    RETURN QUERY
    WITH picked AS (
        SELECT c.run_id, c.node, c.effect_uncertain, c.available_at
          FROM unnest(p_actions) AS a(action)
         CROSS JOIN LATERAL (
               SELECT s.run_id, s.node, s.available_at, s.effect_uncertain
                 FROM cyclone.steps s
                WHERE s.status = 'available' AND s.action = a.action
                  AND s.available_at <= v_now
                  AND NOT (s.effect_uncertain AND s.action = ANY (p_unsafe))
                ORDER BY s.available_at
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED) c
         ORDER BY c.available_at
         LIMIT p_limit
    ), claimed AS (
        UPDATE cyclone.steps s
           SET status = 'running',
               attempt = s.attempt + 1,
               lease_token = gen_random_uuid(),
               started_at = v_now,
               last_heartbeat_at = v_now,
               deadline_at = v_now + s.timeout,
               lease_expires_at = v_now + least(p_lease, s.timeout),
               worker_id = p_worker,
               unsafe = s.action = ANY (p_unsafe),
               effect_uncertain = false
          FROM picked p
         WHERE s.run_id = p.run_id AND s.node = p.node
        RETURNING s.run_id, s.node, s.action, s.attempt, s.max_attempts, s.input,
                  s.depends_on, s.lease_token, s.lease_expires_at, s.deadline_at,
                  s.progress, p.effect_uncertain, p.available_at
    )
    SELECT c.run_id, c.node, c.action, r.workflow, c.attempt, c.max_attempts, c.input,
           r.input,
           CASE WHEN cardinality(c.depends_on) > 0 THEN (
               SELECT jsonb_object_agg(u.node, u.output) FROM cyclone.steps u
                WHERE u.run_id = c.run_id AND u.node = ANY (c.depends_on)
                  AND u.status = 'completed') END,
           c.lease_token, c.lease_expires_at, c.deadline_at, c.progress,
           c.effect_uncertain, false, extract(epoch FROM v_now - c.available_at)::float8
      FROM claimed c JOIN cyclone.runs r ON r.run_id = c.run_id;
END;
$$;

-- As in 0002, and records the heartbeat's time.
CREATE OR REPLACE FUNCTION cyclone.step_heartbeat(
    p_run_id uuid, p_node text, p_lease_token uuid, p_lease interval, p_progress jsonb,
    OUT lease_expires_at timestamptz, OUT cancelled boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := cyclone.now();
    v_step record;
BEGIN
    UPDATE cyclone.steps s
       SET lease_expires_at = least(v_now + p_lease, s.deadline_at),
           last_heartbeat_at = v_now,
           progress = coalesce(p_progress, s.progress)
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'running'
       AND s.lease_token = p_lease_token AND s.lease_expires_at > v_now
    RETURNING s.lease_expires_at INTO lease_expires_at;
    IF FOUND THEN
        cancelled := false;
        RETURN;
    END IF;
    SELECT s.status, s.lease_token, s.attempt INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
    IF v_step.status = 'cancelled' AND v_step.lease_token = p_lease_token THEN
        cancelled := true;
        RETURN;
    END IF;
    PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                v_step.lease_token, v_step.attempt);
END;
$$;

-- The recovery sweep of 0002, returning each step it reclaimed: its run, node, action,
-- the attempt whose lease expired, the worker that held it, and the status it was
-- left in (available, or discarded when out of attempts). Same locking: run rows
-- with SKIP LOCKED, each step guarded by its lease, so sweepers never fight.
CREATE FUNCTION cyclone.sweep_steps(p_limit integer)
RETURNS TABLE (run_id uuid, node text, action text, attempt integer, worker_id text,
               status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := cyclone.now();
    v_cand record;
    v_step record;
BEGIN
    FOR v_cand IN
        SELECT s.run_id, s.node, s.lease_token FROM cyclone.steps s
         WHERE s.status = 'running' AND s.lease_expires_at <= v_now
         ORDER BY s.lease_expires_at LIMIT p_limit
    LOOP
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM cyclone.runs r
             WHERE r.run_id = v_cand.run_id AND r.status = 'running'
               FOR NO KEY UPDATE SKIP LOCKED);
        UPDATE cyclone.steps s
           SET status = CASE WHEN s.attempt >= s.max_attempts AND NOT s.unsafe
                             THEN 'discarded' ELSE 'available' END,
               available_at = CASE WHEN s.attempt >= s.max_attempts AND NOT s.unsafe
                                   THEN NULL ELSE v_now END,
               finished_at = CASE WHEN s.attempt >= s.max_attempts AND NOT s.unsafe
                                  THEN v_now END,
               effect_uncertain = true,
               lease_expires_at = NULL
         WHERE s.run_id = v_cand.run_id AND s.node = v_cand.node AND s.status = 'running'
           AND s.lease_token = v_cand.lease_token AND s.lease_expires_at <= v_now
        RETURNING s.status, s.attempt, s.action, s.worker_id INTO v_step;
        CONTINUE WHEN NOT FOUND;
        INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
        VALUES (v_cand.run_id, v_cand.node, v_step.attempt, 'lease_expired', 'LeaseExpired',
                format('lease of worker %s expired with no outcome', v_step.worker_id),
                v_step.status = 'available', v_now);
        IF v_step.status = 'discarded' THEN
            PERFORM cyclone._settle(v_cand.run_id, ARRAY[v_cand.node], '{}', 1);
        ELSE
            PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
        END IF;
        run_id := v_cand.run_id;
        node := v_cand.node;
        action := v_step.action;
        attempt := v_step.attempt;
        worker_id := v_step.worker_id;
        status := v_step.status;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- The count-only sweep of 0002, kept for callers that want a number.
CREATE OR REPLACE FUNCTION cyclone.sweep(p_limit integer) RETURNS integer
LANGUAGE sql AS $$
    SELECT count(*)::integer FROM cyclone.sweep_steps(p_limit)
$$;
