-- Transitions by run, for a database sharded by run_id (docs/scaling.md):
-- the Citus claim path (step_candidates, step_claim_run, step_next_due_sharded),
-- retention by key (runs_purge_sharded, submit_keys_purge_sharded) and
-- cyclone.sharded(), which tells the server to use them.

-- The EffectUncertain error of a run blocked on its uncertain node (the run's error
-- and the claim's log line). Called by step_claim_run.
CREATE FUNCTION cyclone._effect_uncertain(
    p_run_id uuid, p_node text, p_action text, p_attempt integer, p_started_at timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'kind', 'EffectUncertain',
        'message', format(
            'node %s (action %s) lost its lease at attempt %s (started %s) with no '
            'outcome; its effect may have happened. Check, then resolve: cyclone '
            'resolve %s %s --result JSON | --error MSG | --discard', p_node, p_action,
            p_attempt, cyclone._when(p_started_at), p_run_id, p_node),
        'node', p_node, 'attempt', p_attempt, 'started_at', p_started_at)
$$;

-- A claim on a sharded database, its first read: up to p_limit ready steps of these
-- actions on every shard, highest priority first, then oldest, as step_claim walks
-- them; no locks. step_claim_run then takes them, one run (one shard) at a time. (The
-- time is read here, not in the statement: on Citus a shard's statement may not read
-- the clock, a reference table.) RPC: Claim, on Citus.
CREATE FUNCTION cyclone.step_candidates(p_actions text[], p_limit integer)
RETURNS TABLE (run_id uuid, node text)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    RETURN QUERY
    SELECT s.run_id, s.node
      FROM cyclone.steps s
     WHERE s.status = 'available' AND s.action = ANY (p_actions) AND s.available_at <= v_now
     ORDER BY s.priority DESC, s.available_at
     LIMIT p_limit;
END;
$$;

-- step_claim for the ready steps p_nodes of one run, which a multi-shard read found
-- (the named query step_candidates): the same rows, the same changes, on one shard.
-- Each step is taken only if it is still available and due (FOR UPDATE SKIP LOCKED: a
-- step another claim holds or took is passed over), so candidates read by several
-- servers at once are handed out once. An uncertain step of an action the worker
-- marks unsafe blocks the run instead and is returned first with blocked = true (as
-- _block_uncertain does). Flow control (rate limits, concurrency keys) is not applied
-- here: it counts across runs (docs/scaling.md). RPC: Claim, on Citus.
CREATE FUNCTION cyclone.step_claim_run(
    p_run_id uuid, p_nodes text[], p_worker text, p_unsafe text[], p_lease interval)
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_step    record;
    -- The steps taken, and for each (by position) its new lease token, deadline and
    -- expiry, whether it is uncertain, since when it was ready and whether it slept.
    -- Computed here and joined in by node: Citus refuses volatile functions, and
    -- timestamptz arithmetic on columns, in an UPDATE of a distributed table (and an
    -- array subscript by a column crashed its planner).
    v_nodes   text[] := '{}';
    v_tokens  uuid[] := '{}';
    v_ends    timestamptz[] := '{}';
    v_leases  timestamptz[] := '{}';
    v_unsure  boolean[] := '{}';
    v_since   timestamptz[] := '{}';
    v_slept   text[] := '{}';
BEGIN
    FOR v_step IN
        SELECT s.node, s.action, s.attempt, s.max_attempts, s.started_at
          FROM cyclone.steps s
         WHERE s.run_id = p_run_id AND s.node = ANY (p_nodes) AND s.status = 'available'
           AND s.effect_uncertain AND s.action = ANY (p_unsafe)
           FOR UPDATE SKIP LOCKED
    LOOP
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM cyclone.runs r
             WHERE r.run_id = p_run_id AND r.status = 'running'
               FOR NO KEY UPDATE SKIP LOCKED);
        UPDATE cyclone.steps s SET status = 'uncertain'
         WHERE s.run_id = p_run_id AND s.node = v_step.node;
        workflow := cyclone._run_block(p_run_id, cyclone._effect_uncertain(
            p_run_id, v_step.node, v_step.action, v_step.attempt, v_step.started_at), v_now);
        RETURN QUERY SELECT p_run_id, v_step.node, v_step.action, workflow, v_step.attempt,
                            v_step.max_attempts, NULL::jsonb, NULL::jsonb, NULL::jsonb,
                            NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::jsonb,
                            true, true, NULL::float8, NULL::jsonb, NULL::jsonb;
    END LOOP;

    FOR v_step IN
        SELECT s.node, s.effect_uncertain, s.available_at, s.waiting_for = 'sleep' AS slept,
               v_now + s.timeout AS deadline_at,
               v_now + least(p_lease, s.timeout) AS lease_expires_at
          FROM cyclone.steps s
         WHERE s.run_id = p_run_id AND s.node = ANY (p_nodes) AND s.status = 'available'
           AND s.available_at <= v_now
           AND NOT (s.effect_uncertain AND s.action = ANY (p_unsafe))
           FOR UPDATE SKIP LOCKED
    LOOP
        v_nodes := v_nodes || v_step.node;
        v_tokens := v_tokens || gen_random_uuid();
        v_ends := v_ends || v_step.deadline_at;
        v_leases := v_leases || v_step.lease_expires_at;
        v_unsure := v_unsure || v_step.effect_uncertain;
        v_since := v_since || v_step.available_at;
        IF v_step.slept THEN
            v_slept := v_slept || v_step.node;
        END IF;
    END LOOP;
    IF cardinality(v_nodes) = 0 THEN
        RETURN;
    END IF;

    UPDATE cyclone.steps s
       SET status = 'running',
           attempt = s.attempt + 1,
           lease_token = t.token,
           started_at = v_now,
           last_heartbeat_at = v_now,
           deadline_at = t.deadline_at,
           lease_expires_at = t.lease_expires_at,
           worker_id = p_worker,
           unsafe = s.action = ANY (p_unsafe),
           effect_uncertain = false,
           waiting_for = CASE WHEN s.waiting_for = 'sleep' THEN NULL ELSE s.waiting_for END
      FROM unnest(v_nodes, v_tokens, v_ends, v_leases)
           AS t(node, token, deadline_at, lease_expires_at)
     WHERE s.run_id = p_run_id AND s.node = t.node AND s.status = 'available';

    -- As in step_claim: a sleep is over once its node is claimed at its wake time.
    IF cardinality(v_slept) > 0 THEN
        UPDATE cyclone.step_calls j
           SET status = 'succeeded', output = 'null', finished_at = v_now,
               attempt = (SELECT s.attempt FROM cyclone.steps s
                           WHERE s.run_id = p_run_id AND s.node = j.node)
         WHERE j.run_id = p_run_id AND j.node = ANY (v_slept)
           AND j.status = 'waiting' AND j.function = 'cyclone.sleep' AND j.wake_at <= v_now;
    END IF;

    RETURN QUERY
    SELECT p_run_id, c.node, c.action, r.workflow, c.attempt, c.max_attempts, c.input,
           r.input,
           CASE WHEN cardinality(c.depends_on) > 0 THEN (
               SELECT jsonb_object_agg(u.node, u.output) FROM cyclone.steps u
                WHERE u.run_id = p_run_id AND u.node = ANY (c.depends_on)
                  AND u.status = 'completed') END,
           c.lease_token, c.lease_expires_at, c.deadline_at, c.progress,
           t.uncertain, false, extract(epoch FROM v_now - t.since)::float8,
           CASE WHEN c.deps_failed > 0 THEN (
               SELECT jsonb_agg(jsonb_build_object(
                          'node', u.node, 'status', u.status,
                          'error', CASE WHEN u.status = 'discarded' THEN (
                              SELECT jsonb_build_object(
                                         'attempt', e.attempt, 'kind', e.kind, 'type', e.type,
                                         'message', e.message, 'details', e.details,
                                         'retryable', e.retryable, 'at', e.at)
                                FROM cyclone.step_errors e
                               WHERE e.run_id = p_run_id AND e.node = u.node
                               ORDER BY e.at DESC, e.attempt DESC LIMIT 1) END)
                      ORDER BY u.position)
                 FROM cyclone.steps u
                WHERE u.run_id = p_run_id AND u.node = ANY (c.depends_on)
                  AND u.status IN ('discarded', 'skipped')) END,
           -- _step_call_json's shape; on Citus a shard's row has the shard's type.
           (SELECT jsonb_agg(to_jsonb(j) - 'run_id' - 'node' ORDER BY j.seq)
              FROM cyclone.step_calls j
             WHERE j.run_id = p_run_id AND j.node = c.node)
      FROM cyclone.steps c
      JOIN unnest(v_nodes, v_tokens, v_unsure, v_since) AS t(node, token, uncertain, since)
        ON t.node = c.node AND t.token = c.lease_token
     CROSS JOIN (SELECT r.workflow, r.input FROM cyclone.runs r WHERE r.run_id = p_run_id) r
     WHERE c.run_id = p_run_id AND c.status = 'running';
END;
$$;

-- Whether the run-level tables are distributed (Citus): the server then claims, purges
-- and forgets keys with the functions of this file (Store.sharded).
CREATE FUNCTION cyclone.sharded() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    RETURN (SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
                            WHERE logicalrelid = 'cyclone.runs'::regclass));
END;
$$;

-- step_next_due on a sharded database: seconds until the soonest ready step of these
-- actions comes due (a backoff, a start time), read across shards; NULL when none
-- waits. Rate limits and concurrency keys are not applied on Citus (step_claim_run).
-- Asked by a waiting Claim to set its timer.
CREATE FUNCTION cyclone.step_next_due_sharded(p_actions text[]) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    RETURN extract(epoch FROM (SELECT min(s.available_at) FROM cyclone.steps s
                                WHERE s.status = 'available' AND s.action = ANY (p_actions)
                                  AND s.available_at > v_now) - v_now)::float8;
END;
$$;

-- runs_purge on a sharded database: the same runs (finished more than p_age ago,
-- failed ones when p_failed, else completed and cancelled ones, oldest first, up to
-- p_limit), found by a multi-shard read and then deleted one by one by key, each
-- delete re-checking the status on its run's shard (the cascades stay on that shard).
-- Returns how many runs it deleted. Called by each server's retention loop, on Citus.
CREATE FUNCTION cyclone.runs_purge_sharded(p_age interval, p_failed boolean, p_limit integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_before   timestamptz := cyclone.now() - p_age;
    v_statuses text[] := CASE WHEN p_failed THEN ARRAY['failed']
                              ELSE ARRAY['completed', 'cancelled'] END;
    v_runs     uuid[];
    v_run      uuid;
    v_count    integer := 0;
BEGIN
    v_runs := ARRAY(SELECT r.run_id FROM cyclone.runs r
                     WHERE r.status = ANY (v_statuses) AND r.finished_at < v_before
                     ORDER BY r.finished_at LIMIT p_limit);
    FOREACH v_run IN ARRAY v_runs LOOP
        DELETE FROM cyclone.runs r WHERE r.run_id = v_run AND r.status = ANY (v_statuses);
        v_count := v_count + (CASE WHEN FOUND THEN 1 ELSE 0 END);
    END LOOP;
    RETURN v_count;
END;
$$;

-- submit_keys_purge on a sharded database: up to p_limit keys older than p_age whose
-- run is gone, found by a multi-shard read (a key and its run share a shard: the run's
-- id is the key's) and deleted one by one by key. Keys made before migration 0027,
-- whose run has another id, are kept. Called by each server's retention loop, on Citus.
CREATE FUNCTION cyclone.submit_keys_purge_sharded(p_age interval, p_limit integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_before timestamptz := cyclone.now() - p_age;
    v_keys   uuid[];
    v_key    uuid;
    v_count  integer := 0;
BEGIN
    v_keys := ARRAY(SELECT k.key_id FROM cyclone.submit_keys k
                     WHERE k.created_at < v_before AND k.run_id = k.key_id
                       AND NOT EXISTS (SELECT 1 FROM cyclone.runs r WHERE r.run_id = k.key_id)
                     ORDER BY k.created_at LIMIT p_limit);
    FOREACH v_key IN ARRAY v_keys LOOP
        DELETE FROM cyclone.submit_keys k
         WHERE k.key_id = v_key
           AND NOT EXISTS (SELECT 1 FROM cyclone.runs r WHERE r.run_id = v_key);
        v_count := v_count + (CASE WHEN FOUND THEN 1 ELSE 0 END);
    END LOOP;
    RETURN v_count;
END;
$$;
