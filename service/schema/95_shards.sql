-- Transitions by run, for a database sharded by run_id (Citus; docs/scaling.md). Each
-- function here touches one run's rows only, so on Citus each call is a single-shard
-- transaction; they also work, and are tested, on one Postgres. The server uses them
-- in place of the cross-run statements (step_claim, runs_purge, submit_keys_purge)
-- when the database is distributed (service/db/pool.py, Pool.is_sharded).

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

-- A claim on a sharded database, its first read, as servers before migration 0029 made
-- it (kept for them during an upgrade; step_candidates_sharded replaces it): up to
-- p_limit ready steps of these actions on every shard, highest priority first, then
-- oldest, as step_claim walks them; no locks. (The time is read here, not in the
-- statement: on Citus a shard's statement may not read the clock, a reference table.)
CREATE FUNCTION cyclone.step_candidates(p_actions text[], p_limit integer)
RETURNS TABLE (run_id uuid, node text)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    -- Paused actions and workflows (75_pauses.sql), passed over.
    v_off   text[] := ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'action');
    v_flows text[] := ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'workflow');
BEGIN
    RETURN QUERY
    SELECT s.run_id, s.node
      FROM cyclone.steps s
     WHERE s.status = 'available' AND s.action = ANY (p_actions) AND s.available_at <= v_now
       AND s.action <> ALL (v_off)
       AND (cardinality(v_flows) = 0
            OR NOT EXISTS (SELECT 1 FROM cyclone.runs w
                            WHERE w.run_id = s.run_id AND w.workflow = ANY (v_flows)))
     ORDER BY s.priority DESC, s.available_at
     LIMIT p_limit;
END;
$$;

-- step_claim for the ready steps p_nodes of one run, which a multi-shard read found
-- (step_candidates_sharded): the same rows, the same changes, on one shard.
-- Each step is taken only if it is still available and due (FOR UPDATE SKIP LOCKED: a
-- step another claim holds or took is passed over), so candidates read by several
-- servers at once are handed out once. An uncertain step of an action the worker
-- marks unsafe blocks the run instead and is returned first with blocked = true (as
-- _block_uncertain does). Flow control (rate limits, concurrency keys) is not applied
-- here: it counts across runs, under locks step_claim_flow takes before calling this.
-- Builds as in step_claim: p_build the worker's (NULL: none), p_builds its set
-- (cyclone._build_set, read by the server on the coordinator); a step the worker's
-- build may not take (_build_admits) is passed over.
-- Called by step_claim_shard and step_claim_flow, on Citus.
CREATE FUNCTION cyclone.step_claim_run(
    p_run_id uuid, p_nodes text[], p_worker text, p_unsafe text[], p_lease interval,
    p_build text DEFAULT NULL, p_builds text[] DEFAULT '{}')
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb, run_deadline timestamptz, traceparent text)
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
    v_pins    text[] := '{}';
BEGIN
    -- A worker whose lease lapsed is handed nothing until it shows it is alive (checked
    -- here to block no run for it, and again by the pick, in the pick's snapshot).
    IF EXISTS (SELECT 1 FROM cyclone.worker_health h WHERE h.worker_id = p_worker) THEN
        RETURN;
    END IF;
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
                            true, true, NULL::float8, NULL::jsonb, NULL::jsonb,
                            NULL::timestamptz, NULL::text;
    END LOOP;

    FOR v_step IN
        SELECT s.node, s.effect_uncertain, s.available_at, s.waiting_for = 'sleep' AS slept,
               v_now + s.timeout AS deadline_at,
               v_now + least(p_lease, s.timeout) AS lease_expires_at,
               -- The pin stays while the node has a journal; else this build's.
               CASE WHEN s.build_id IS NOT NULL AND EXISTS (
                         SELECT 1 FROM cyclone.step_calls j
                          WHERE j.run_id = p_run_id AND j.node = s.node OFFSET 0)
                    THEN s.build_id ELSE p_build END AS pin
          FROM cyclone.steps s
         WHERE s.run_id = p_run_id AND s.node = ANY (p_nodes) AND s.status = 'available'
           AND s.available_at <= v_now
           AND NOT (s.effect_uncertain AND s.action = ANY (p_unsafe))
           AND cyclone._build_admits(s.build_id, p_builds, EXISTS (
                   SELECT 1 FROM cyclone.step_calls j
                    WHERE j.run_id = p_run_id AND j.node = s.node OFFSET 0))
           -- In this statement's snapshot, with the steps: a sweep that freed a step
           -- and marked this worker is seen whole or not at all.
           AND NOT EXISTS (SELECT 1 FROM cyclone.worker_health h WHERE h.worker_id = p_worker)
           FOR UPDATE SKIP LOCKED
    LOOP
        v_pins := v_pins || v_step.pin;
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
           waiting_for = CASE WHEN s.waiting_for = 'sleep' THEN NULL ELSE s.waiting_for END,
           build_id = t.pin
      FROM unnest(v_nodes, v_tokens, v_ends, v_leases, v_pins)
           AS t(node, token, deadline_at, lease_expires_at, pin)
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
           -- _step_call_json's shape; on Citus a shard's row has the shard's type. A
           -- first claim has no journal (step_claim).
           CASE WHEN c.attempt > 1 THEN (
               SELECT jsonb_agg(to_jsonb(j) - 'run_id' - 'node' ORDER BY j.seq)
                 FROM cyclone.step_calls j
                WHERE j.run_id = p_run_id AND j.node = c.node) END,
           r.deadline, r.traceparent
      FROM cyclone.steps c
      JOIN unnest(v_nodes, v_tokens, v_unsure, v_since) AS t(node, token, uncertain, since)
        ON t.node = c.node AND t.token = c.lease_token
     CROSS JOIN (SELECT r.workflow, r.input, r.deadline, r.traceparent
                   FROM cyclone.runs r WHERE r.run_id = p_run_id) r
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

-- step_next_due on a sharded database: seconds until a claim of these actions may find
-- work, read across shards; NULL when none waits: the soonest ready step coming due
-- since the last claim, p_since seconds ago (a backoff, a start time; negative when it
-- came due after that claim), or, when a step is due already but the claim took nothing,
-- the time a rate-limited action's window opens again (reopens_at). A key has no such
-- time: the step that frees its slot wakes the claims of its action (as on one
-- Postgres, step_next_due). Asked by a waiting Claim to set its timer.
CREATE FUNCTION cyclone.step_next_due_sharded(p_actions text[], p_since float8 DEFAULT 0)
RETURNS float8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now   timestamptz := cyclone.now();
    v_claim timestamptz := v_now - make_interval(secs => greatest(p_since, 0));
    v_next  timestamptz;
    v_due   text[];
    v_opens timestamptz;
BEGIN
    v_next := (SELECT min(s.available_at) FROM cyclone.steps s
                WHERE s.status = 'available' AND s.action = ANY (p_actions)
                  AND s.available_at > v_claim);
    IF EXISTS (SELECT 1 FROM cyclone.action_rates t
                WHERE t.action = ANY (p_actions) AND t.reopens_at > v_now) THEN
        v_due := ARRAY(SELECT DISTINCT s.action FROM cyclone.steps s
                        WHERE s.status = 'available' AND s.action = ANY (p_actions)
                          AND s.available_at <= v_now);
        v_opens := (SELECT min(t.reopens_at) FROM cyclone.action_rates t
                     WHERE t.action = ANY (v_due) AND t.reopens_at > v_now);
    END IF;
    RETURN extract(epoch FROM least(v_next, v_opens) - v_now)::float8;
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

-- The shard of each run of p_runs (aligned), to group a claim's runs by shard: Citus's
-- shard id, or 0 for all on a database that is not distributed. Called by
-- step_candidates_sharded.
CREATE FUNCTION cyclone._shards_of(p_runs uuid[]) RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT cyclone.sharded() THEN
        RETURN array_fill(0::bigint, ARRAY[coalesce(cardinality(p_runs), 0)]);
    END IF;
    -- Citus's own function, so only run on Citus (PL/pgSQL plans it at first use).
    RETURN ARRAY(SELECT get_shard_id_for_distribution_column('cyclone.runs', u.r)
                   FROM unnest(p_runs) WITH ORDINALITY AS u(r, i) ORDER BY u.i);
END;
$$;

-- A claim on a sharded database, its first read (Store._claim_sharded): up to p_limit
-- ready steps of these actions across every shard, highest priority first, then oldest
-- (step_claim's order), no locks, each with its run's shard and whether flow control
-- applies to it (flow: it has a concurrency key, or its action is one the worker
-- declares rate limited, p_rate_actions with p_rate_counts per p_rate_periods). As in
-- step_claim's walk, keys already full and rated actions whose window is full (as last
-- written) are passed over, so that they do not fill the batch; step_claim_flow counts
-- both again under their locks. Keys are looked at only when the read met a keyed step.
-- Steps the worker's build may not take (p_builds its set, as in step_claim_run) are
-- passed over too.
-- RPC: Claim, on Citus.
CREATE FUNCTION cyclone.step_candidates_sharded(
    p_actions text[], p_limit integer, p_rate_actions text[], p_rate_counts integer[],
    p_rate_periods interval[], p_builds text[] DEFAULT '{}')
RETURNS TABLE (run_id uuid, node text, action text, shard bigint, concurrency_key text,
               concurrency_limit integer, flow boolean)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    -- Rate-limited actions whose window is full, and paused actions (75_pauses.sql).
    v_shut   text[] := ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'action');
    -- Paused workflows: their runs' steps are passed over.
    v_flows  text[] := ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'workflow');
    v_full   text[] := '{}';
    v_runs   uuid[];
    v_nodes  text[];
    v_acts   text[];
    v_keys   text[];
    v_limits integer[];
BEGIN
    IF cardinality(p_rate_actions) > 0 THEN
        v_shut := v_shut || ARRAY(
            SELECT r.action
              FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods) AS r(action, count, period)
              JOIN cyclone.action_rates t ON t.action = r.action
             WHERE (SELECT coalesce(sum(b.n), 0) FROM unnest(t.lasts, t.counts) AS b(last, n)
                     WHERE b.last > v_now - r.period) >= r.count);
    END IF;
    FOR pass IN 1 .. 2 LOOP
        SELECT array_agg(c.run_id ORDER BY c.i), array_agg(c.node ORDER BY c.i),
               array_agg(c.action ORDER BY c.i), array_agg(c.concurrency_key ORDER BY c.i),
               array_agg(c.concurrency_limit ORDER BY c.i)
          INTO v_runs, v_nodes, v_acts, v_keys, v_limits
          FROM (SELECT s.run_id, s.node, s.action, s.concurrency_key, s.concurrency_limit,
                       row_number() OVER (ORDER BY s.priority DESC, s.available_at) AS i
                  FROM (SELECT s.run_id, s.node, s.action, s.concurrency_key,
                               s.concurrency_limit, s.priority, s.available_at
                          FROM cyclone.steps s
                         WHERE s.status = 'available' AND s.action = ANY (p_actions)
                           AND s.available_at <= v_now AND s.action <> ALL (v_shut)
                           AND (s.concurrency_key IS NULL OR s.concurrency_key <> ALL (v_full))
                           AND cyclone._build_admits(s.build_id, p_builds, EXISTS (
                                   SELECT 1 FROM cyclone.step_calls j
                                    WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0))
                           AND (cardinality(v_flows) = 0
                                OR NOT EXISTS (SELECT 1 FROM cyclone.runs w
                                                WHERE w.run_id = s.run_id
                                                  AND w.workflow = ANY (v_flows)))
                         ORDER BY s.priority DESC, s.available_at
                         LIMIT p_limit) s) c;
        EXIT WHEN pass = 2 OR v_runs IS NULL
                  OR NOT EXISTS (SELECT 1 FROM unnest(v_keys) k WHERE k IS NOT NULL);
        -- The keys with as many running steps as their limit (a multi-shard read).
        v_full := ARRAY(SELECT k.concurrency_key FROM cyclone.steps k
                         WHERE k.status = 'running' AND k.concurrency_key IS NOT NULL
                         GROUP BY k.concurrency_key
                        HAVING count(*) >= min(k.concurrency_limit));
        EXIT WHEN NOT EXISTS (SELECT 1 FROM unnest(v_keys) k WHERE k = ANY (v_full));
    END LOOP;
    IF v_runs IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT u.run_id, u.node, u.action, u.shard, u.concurrency_key, u.concurrency_limit,
           u.concurrency_key IS NOT NULL OR u.action = ANY (p_rate_actions)
      FROM unnest(v_runs, v_nodes, v_acts, cyclone._shards_of(v_runs), v_keys, v_limits)
           WITH ORDINALITY AS u(run_id, node, action, shard, concurrency_key,
                                concurrency_limit, i)
     ORDER BY u.i;
END;
$$;

-- The names of this node's copies of the reference tables p_tables (Citus keeps one on
-- every node, under the table's shard's name), to read them as the plain tables they
-- are: Citus plans a statement on a reference table as a distributed query and runs it
-- locally from text at every call (0.1-0.45 ms for the reads of the clock, the pauses
-- and the rates). A table's own name on a database that is not distributed, or where
-- this node has no copy. Called by the functions that run on a shard's node.
CREATE FUNCTION cyclone._here(p_tables text[]) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_names text[] := '{}';
    v_name  text;
    v_table text;
BEGIN
    IF NOT cyclone.sharded() THEN
        RETURN ARRAY(SELECT format('cyclone.%I', t) FROM unnest(p_tables) t);
    END IF;
    FOREACH v_table IN ARRAY p_tables LOOP
        -- Kept for the session (cyclone.here_<table>): a reference table keeps its one
        -- shard for its life, and a name no longer there (the schema made anew) is
        -- looked up again. Looking it up costs more than the read it serves.
        v_name := current_setting('cyclone.here_' || v_table, true);
        IF coalesce(v_name, '') = '' OR to_regclass(v_name) IS NULL THEN
            v_name := (SELECT format('cyclone.%I', v_table || '_' || s.shardid)
                         FROM pg_dist_shard s
                        WHERE s.logicalrelid = to_regclass('cyclone.' || v_table)
                        LIMIT 1);
            IF v_name IS NULL OR to_regclass(v_name) IS NULL THEN
                v_name := format('cyclone.%I', v_table);
            ELSE
                PERFORM set_config('cyclone.here_' || v_table, v_name, false);
            END IF;
        END IF;
        v_names := v_names || v_name;
    END LOOP;
    RETURN v_names;
END;
$$;

-- The name of this session's prepared statement of p_sql, whose parameters have the
-- types p_types, prepared now if the session has none. The functions delegated to a
-- shard's node address the shard's tables by name, so their statements are EXECUTEd
-- from text, and Postgres would parse and plan each one at every call (about a
-- millisecond for a claim's); a prepared statement keeps its plan for the session
-- and is planned again only when its tables change. Its name is a 64-bit hash of its
-- text: another shard's statement, or one a later migration rewrites, is another
-- statement. The session's statements are listed once per transaction (in the
-- setting cyclone.prepared, local to it): pg_prepared_statements writes out every
-- statement's text each time it is read, and a call of ours asks for several
-- statements (a client may deallocate them between transactions, never within
-- one of our calls). Run as EXECUTE format('EXECUTE %I(%L, ...)', name, values...):
-- EXECUTE ... USING cannot pass parameters to a prepared statement. Called by the
-- functions that run on a shard's node.
CREATE FUNCTION cyclone._prepared(p_types text, p_sql text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_name  text := 'cyclone_' || to_hex(hashtextextended(p_types || ';' || p_sql, 0));
    v_known text := current_setting('cyclone.prepared', true);
BEGIN
    IF coalesce(v_known, '') = '' THEN
        v_known := ',' || coalesce((SELECT string_agg(p.name, ',')
                                      FROM pg_catalog.pg_prepared_statements p
                                     WHERE p.name LIKE 'cyclone\_%'), '') || ',';
    ELSIF position(',' || v_name || ',' IN v_known) > 0 THEN
        RETURN v_name;
    END IF;
    IF position(',' || v_name || ',' IN v_known) = 0 THEN
        EXECUTE format('PREPARE %I %s AS %s', v_name,
                       CASE WHEN p_types <> '' THEN '(' || p_types || ')' ELSE '' END, p_sql);
        v_known := v_known || v_name || ',';
    END IF;
    PERFORM set_config('cyclone.prepared', v_known, true);
    RETURN v_name;
END;
$$;

-- cyclone.now() read from this node's copy of the clock (_here) by a prepared
-- statement: on a worker node Citus would plan cyclone.now()'s read of the reference
-- table as a distributed query at every call, and a statement EXECUTEd from text is
-- planned at every call too. Called by the functions that run on a shard's node.
CREATE FUNCTION cyclone._now_here() RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
BEGIN
    EXECUTE format('EXECUTE %I', cyclone._prepared('', format(
        'SELECT statement_timestamp() + offset_by FROM %s', (cyclone._here(ARRAY['clock']))[1])))
       INTO v_now;
    RETURN v_now;
END;
$$;

-- The statement that takes the steps of several runs of one shard: $1 the runs, $2 their
-- nodes (aligned), $3 a lease token for each, $4 the time, $5 the worker, $6 the lease,
-- $7 the worker's build, $8 its set; p_tables the tables as this node holds them:
-- steps, step_calls, step_errors, runs (a shard's, or the tables themselves), then
-- worker_health (a reference table: its shard is on every node). Run with hash and merge
-- joins off (each step is found by its key). The claimed steps' answers, in the order
-- of $1. Called by step_claim_shard and step_claim_node.
CREATE FUNCTION cyclone._step_claim_sql(p_tables text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN
    RETURN format($q$
            WITH picked AS (
                SELECT s.run_id, s.node, t.token, s.effect_uncertain AS uncertain,
                       s.available_at AS since, s.waiting_for = 'sleep' AS slept, t.i,
                       CASE WHEN s.build_id IS NOT NULL AND EXISTS (
                                 SELECT 1 FROM %2$s j
                                  WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0)
                            THEN s.build_id ELSE $7 END AS pin
                  FROM unnest($1, $2, $3) WITH ORDINALITY AS t(run_id, node, token, i)
                  JOIN %1$s s ON s.run_id = t.run_id AND s.node = t.node
                 WHERE s.status = 'available' AND s.available_at <= $4
                   AND cyclone._build_admits(s.build_id, $8, EXISTS (
                           SELECT 1 FROM %2$s j
                            WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0))
                   -- The worker's mark in the pick's snapshot (see step_claim_run).
                   AND NOT EXISTS (SELECT 1 FROM %5$s h WHERE h.worker_id = $5)
                   FOR UPDATE OF s SKIP LOCKED
            ), claimed AS (
                UPDATE %1$s s
                   SET status = 'running',
                       attempt = s.attempt + 1,
                       lease_token = p.token,
                       started_at = $4,
                       last_heartbeat_at = $4,
                       deadline_at = cyclone._later($4, s.timeout),
                       lease_expires_at = cyclone._later($4, least($6, s.timeout)),
                       worker_id = $5,
                       unsafe = false,
                       effect_uncertain = false,
                       waiting_for = CASE WHEN s.waiting_for = 'sleep' THEN NULL
                                          ELSE s.waiting_for END,
                       build_id = p.pin
                  FROM picked p
                 WHERE s.run_id = p.run_id AND s.node = p.node
                RETURNING s.run_id, s.node, s.action, s.attempt, s.max_attempts, s.input,
                          s.depends_on, s.deps_failed, s.lease_token, s.lease_expires_at,
                          s.deadline_at, s.progress
            ), slept AS (
                -- As in step_claim: a sleep is over once its node is claimed at its wake time.
                UPDATE %2$s j
                   SET status = 'succeeded', output = 'null', finished_at = $4,
                       attempt = c.attempt
                  FROM claimed c
                  JOIN picked p ON p.run_id = c.run_id AND p.node = c.node AND p.slept
                 WHERE j.run_id = c.run_id AND j.node = c.node
                   AND j.status = 'waiting' AND j.function = 'cyclone.sleep'
                   AND j.wake_at <= $4
                RETURNING j.run_id, j.node, j.step_id
            )
            SELECT c.run_id, c.node, c.action, r.workflow, c.attempt, c.max_attempts, c.input,
                   r.input,
                   CASE WHEN cardinality(c.depends_on) > 0 THEN (
                       SELECT jsonb_object_agg(u.node, u.output) FROM %1$s u
                        WHERE u.run_id = c.run_id AND u.node = ANY (c.depends_on)
                          AND u.status = 'completed') END,
                   c.lease_token, c.lease_expires_at, c.deadline_at, c.progress,
                   p.uncertain, false, extract(epoch FROM $4 - p.since)::float8,
                   CASE WHEN c.deps_failed > 0 THEN (
                       SELECT jsonb_agg(jsonb_build_object(
                                  'node', u.node, 'status', u.status,
                                  'error', CASE WHEN u.status = 'discarded' THEN (
                                      SELECT jsonb_build_object(
                                                 'attempt', e.attempt, 'kind', e.kind,
                                                 'type', e.type, 'message', e.message,
                                                 'details', e.details, 'retryable', e.retryable,
                                                 'at', e.at)
                                        FROM %3$s e
                                       WHERE e.run_id = c.run_id AND e.node = u.node
                                       ORDER BY e.at DESC, e.attempt DESC LIMIT 1) END)
                              ORDER BY u.position)
                         FROM %1$s u
                        WHERE u.run_id = c.run_id AND u.node = ANY (c.depends_on)
                          AND u.status IN ('discarded', 'skipped')) END,
                   -- _step_call_json's shape (on Citus a shard's row has the shard's type); a
                   -- sleep this claim ended, as slept left it (the statement still sees the
                   -- old version of its row). A first claim has no journal (step_claim).
                   CASE WHEN c.attempt > 1 THEN (SELECT jsonb_agg(CASE WHEN w.step_id IS NULL
                                          THEN to_jsonb(j) - 'run_id' - 'node'
                                          ELSE to_jsonb(j) - 'run_id' - 'node'
                                               || jsonb_build_object('status', 'succeeded',
                                                                     'output', 'null'::jsonb,
                                                                     'finished_at', $4,
                                                                     'attempt', c.attempt) END
                                     ORDER BY j.seq)
                      FROM %2$s j
                      LEFT JOIN slept w
                        ON w.run_id = j.run_id AND w.node = j.node AND w.step_id = j.step_id
                     WHERE j.run_id = c.run_id AND j.node = c.node) END,
                   r.deadline, r.traceparent
              FROM claimed c
              JOIN picked p ON p.run_id = c.run_id AND p.node = c.node
              JOIN %4$s r ON r.run_id = c.run_id
             ORDER BY p.i
$q$, p_tables[1], p_tables[2], p_tables[3], p_tables[4], p_tables[5]);
END;
$f$;

-- step_claim_run for the steps p_nodes of the runs p_runs (aligned), all of one shard,
-- in one call: distributed by p_run_id (any of p_runs), a call is delegated whole to
-- the node holding that shard and is one single-shard transaction there, one round trip
-- for the shard's part of a claim. The same rows and changes as step_claim_run, in one
-- statement for all the runs instead of five per run, on the shard's own tables: on a
-- worker node Citus plans each statement on a distributed table twice (as a distributed
-- query, then as its shard's), which cost more than the work, and a statement over
-- several runs of a distributed table was planned for every shard. When the worker
-- marks actions unsafe, the runs are taken by step_claim_run (an uncertain step blocks
-- its run there). Only steps without flow control are passed here
-- (step_candidates_sharded's flow = false); the others go through step_claim_flow.
-- Builds as in step_claim_run. RPC: Claim, on Citus.
CREATE FUNCTION cyclone.step_claim_shard(
    p_run_id uuid, p_runs uuid[], p_nodes text[], p_worker text, p_unsafe text[],
    p_lease interval, p_build text DEFAULT NULL, p_builds text[] DEFAULT '{}')
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb, run_deadline timestamptz, traceparent text)
LANGUAGE plpgsql
-- Each step is found by its key (step_complete_many says why).
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz;
    v_run    uuid;
    v_nodes  text[];
    -- The tables as this node holds them: on Citus the shards of p_run_id's group,
    -- which this call (delegated to their node) reads and writes as the plain tables
    -- they are, in a statement planned once per session (_prepared) rather than twice
    -- at every call.
    v_tables text[] := ARRAY['cyclone.steps', 'cyclone.step_calls', 'cyclone.step_errors',
                             'cyclone.runs', 'cyclone.worker_health'];
    v_shards text[];
BEGIN
    IF cardinality(p_unsafe) = 0 AND cyclone.sharded() THEN
        v_shards := ARRAY(SELECT format('cyclone.%I', t.name || '_'
                                        || get_shard_id_for_distribution_column(
                                               ('cyclone.' || t.name)::regclass, p_run_id))
                            FROM unnest(ARRAY['steps', 'step_calls', 'step_errors', 'runs',
                                              'worker_health'])
                                 WITH ORDINALITY AS t(name, i)
                           ORDER BY t.i);
        -- Not delegated (called in a transaction block, or the shard moved meanwhile):
        -- the shards are elsewhere, and the runs are taken one by one below.
        IF NOT EXISTS (SELECT 1 FROM unnest(v_shards) n WHERE to_regclass(n) IS NULL) THEN
            v_tables := v_shards;
        END IF;
    END IF;
    IF v_tables[1] = 'cyclone.steps' THEN
        -- A worker whose lease lapsed is handed nothing (and again in the pick's
        -- snapshot, which is all that the shards' own statement below needs).
        IF EXISTS (SELECT 1 FROM cyclone.worker_health h WHERE h.worker_id = p_worker) THEN
            RETURN;
        END IF;
        v_now := cyclone.now();
    ELSE
        v_now := cyclone._now_here();
    END IF;
    -- Run by run, by step_claim_run: when the worker marks actions unsafe, and on the
    -- distributed tables, where a statement over several runs would be planned for
    -- every shard and each of step_claim_run's names its run.
    IF cardinality(p_unsafe) > 0 OR (cyclone.sharded() AND v_tables[1] = 'cyclone.steps') THEN
        FOR v_run IN
            SELECT u.r FROM unnest(p_runs) WITH ORDINALITY AS u(r, i) GROUP BY u.r
             ORDER BY min(u.i)
        LOOP
            v_nodes := ARRAY(SELECT u.n
                               FROM unnest(p_runs, p_nodes) WITH ORDINALITY AS u(r, n, i)
                              WHERE u.r = v_run ORDER BY u.i);
            RETURN QUERY
            SELECT * FROM cyclone.step_claim_run(v_run, v_nodes, p_worker, p_unsafe, p_lease,
                                                 p_build, p_builds);
        END LOOP;
        RETURN;
    END IF;
    -- One statement for every run (_step_claim_sql), with a lease token for each drawn
    -- here: Citus refuses a volatile function in an UPDATE of a distributed table.
    RETURN QUERY EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L, %L)',
        cyclone._prepared('uuid[], text[], uuid[], timestamptz, text, interval, text, text[]',
                          cyclone._step_claim_sql(v_tables)),
        p_runs, p_nodes, ARRAY(SELECT gen_random_uuid() FROM unnest(p_nodes)), v_now,
        p_worker, p_lease, p_build, p_builds);
END;
$$;

-- The part of a claim on a sharded database that flow control applies to: the
-- candidates p_runs / p_nodes (aligned with their p_actions, p_keys and p_limits, in
-- claim order; step_candidates_sharded's flow = true) admitted as step_claim admits
-- them, under the same locks, taken on the coordinator, so that they hold across
-- shards: each rate-limited action's row of action_rates (_rate_room, in action order),
-- then the keys' locks and their running steps counted across shards (_keys_room).
-- Candidates are admitted in order while their action's window and their key have
-- room, up to p_limit; each run's are then taken by step_claim_run, and the admitted
-- claims join their action's window (counted when admitted: a step another claim took
-- meanwhile still counts, so a window may hold fewer claims than it could, never
-- more). The locks are held until this call's transaction commits, after the shards
-- have: a later claim counts what this one took. Not delegated: one transaction on
-- the coordinator, distributed when it takes from several shards or writes a rate.
-- Builds as in step_claim_run. RPC: Claim, on Citus.
CREATE FUNCTION cyclone.step_claim_flow(
    p_runs uuid[], p_nodes text[], p_actions text[], p_keys text[], p_limits integer[],
    p_worker text, p_unsafe text[], p_lease interval, p_limit integer,
    p_rate_actions text[], p_rate_counts integer[], p_rate_periods interval[],
    p_build text DEFAULT NULL, p_builds text[] DEFAULT '{}')
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb, run_deadline timestamptz, traceparent text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := cyclone.now();
    v_rated  text[] := '{}';
    v_rooms  integer[] := '{}';
    v_keys   text[];
    v_limits integer[];
    v_kroom  integer[];
    v_runs   uuid[] := '{}';
    v_nodes  text[] := '{}';
    v_used   integer[];
    v_j      integer;
    v_k      integer;
    v_run    uuid;
    v_rate   record;
BEGIN
    IF cardinality(p_rate_actions) > 0 THEN
        SELECT array_agg(o.action ORDER BY o.action), array_agg(o.room ORDER BY o.action)
          INTO v_rated, v_rooms
          FROM (SELECT r.action, cyclone._rate_room(r.action, r.count, r.period, v_now) AS room
                  FROM (SELECT * FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods)
                                   AS r(action, count, period)
                         ORDER BY r.action OFFSET 0) r) o;
    END IF;
    v_used := array_fill(0, ARRAY[cardinality(v_rated)]);
    SELECT array_agg(k.key ORDER BY k.key), array_agg(k.lim ORDER BY k.key)
      INTO v_keys, v_limits
      FROM (SELECT u.key, min(u.lim) AS lim FROM unnest(p_keys, p_limits) AS u(key, lim)
             WHERE u.key IS NOT NULL GROUP BY u.key) k;
    IF v_keys IS NOT NULL THEN
        v_kroom := ARRAY(SELECT r.room
                           FROM cyclone._keys_room(v_keys, v_limits) r
                           JOIN unnest(v_keys) WITH ORDINALITY AS k(key, i)
                             ON k.key = r.concurrency_key
                          ORDER BY k.i);
    END IF;
    FOR i IN 1 .. coalesce(cardinality(p_runs), 0) LOOP
        EXIT WHEN cardinality(v_runs) >= p_limit;
        v_j := array_position(v_rated, p_actions[i]);
        CONTINUE WHEN v_j IS NOT NULL AND v_rooms[v_j] <= v_used[v_j];
        IF p_keys[i] IS NOT NULL THEN
            v_k := array_position(v_keys, p_keys[i]);
            CONTINUE WHEN v_kroom[v_k] <= 0;
            v_kroom[v_k] := v_kroom[v_k] - 1;
        END IF;
        IF v_j IS NOT NULL THEN
            v_used[v_j] := v_used[v_j] + 1;
        END IF;
        v_runs := v_runs || p_runs[i];
        v_nodes := v_nodes || p_nodes[i];
    END LOOP;
    FOR v_run IN
        SELECT u.r FROM unnest(v_runs) WITH ORDINALITY AS u(r, i) GROUP BY u.r ORDER BY min(u.i)
    LOOP
        RETURN QUERY
        SELECT * FROM cyclone.step_claim_run(
            v_run, ARRAY(SELECT u.n FROM unnest(v_runs, v_nodes) AS u(r, n) WHERE u.r = v_run),
            p_worker, p_unsafe, p_lease, p_build, p_builds);
    END LOOP;
    -- The admitted claims join their action's window (its row locked by _rate_room).
    FOR i IN 1 .. coalesce(cardinality(v_rated), 0) LOOP
        CONTINUE WHEN v_used[i] = 0;
        v_j := array_position(p_rate_actions, v_rated[i]);
        SELECT n.firsts, n.lasts, n.counts, n.reopens_at INTO v_rate
          FROM cyclone.action_rates t
         CROSS JOIN LATERAL cyclone._rate_next(t.firsts, t.lasts, t.counts, p_rate_counts[v_j],
                                               p_rate_periods[v_j], v_now, v_used[i]) n
         WHERE t.action = v_rated[i];
        UPDATE cyclone.action_rates t
           SET firsts = v_rate.firsts, lasts = v_rate.lasts, counts = v_rate.counts,
               reopens_at = v_rate.reopens_at, updated_at = v_now
         WHERE t.action = v_rated[i];
    END LOOP;
END;
$$;

-- Explain's counts of other steps, which on a sharded database are read across shards
-- (so not in the named query step_explain, which reads one run): for a ready step of
-- p_run_id, how many ready steps of its action are ahead of it in claim order (higher
-- priority, or the same and older; at most 10,000 are counted), how many of its action
-- run, and how many run with its concurrency key (up to its limit); NULL where they do
-- not apply, no row for an unknown step. Called by Explain (Store.step_explain).
CREATE FUNCTION cyclone.step_explain_counts(p_run_id uuid, p_node text)
RETURNS TABLE (ready_ahead bigint, action_running bigint, key_running bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now  timestamptz := cyclone.now();
    v_step record;
BEGIN
    SELECT s.status, s.action, s.priority, s.available_at, s.concurrency_key,
           s.concurrency_limit
      INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_step.status = 'available' AND v_step.available_at <= v_now THEN
        ready_ahead := (SELECT count(*) FROM (
            SELECT 1 FROM cyclone.steps q
             WHERE q.status = 'available' AND q.action = v_step.action
               AND q.priority >= v_step.priority AND q.available_at <= v_now
               AND (q.priority > v_step.priority OR q.available_at < v_step.available_at)
             LIMIT 10000) ahead);
    END IF;
    IF v_step.status = 'available' THEN
        action_running := (SELECT count(*) FROM cyclone.steps q
                            WHERE q.status = 'running' AND q.lease_expires_at IS NOT NULL
                              AND q.action = v_step.action);
        IF v_step.concurrency_key IS NOT NULL THEN
            key_running := (SELECT count(*) FROM (
                SELECT 1 FROM cyclone.steps k
                 WHERE k.concurrency_key = v_step.concurrency_key AND k.status = 'running'
                 LIMIT v_step.concurrency_limit) n);
        END IF;
    END IF;
    RETURN NEXT;
END;
$$;

-- The parent wakes that child runs finishing on a worker node of a sharded database
-- owe (Citus: _child_finished's variant in service/sql/citus.sql), one row per child,
-- on the child's shard. A completion there runs where its run lives and may not write
-- to another shard, so the wake of the parent's node, on the parent's shard, is made
-- after that transaction commits, in one of its own (child_wake), and the row is then
-- deleted (child_wake_done): the server that applied the completion does both at once,
-- and every server's sweep delivers rows a crash left (child_wakes_pending). A wake
-- delivered twice changes nothing the second time: it only makes the parent's nodes
-- that still wait for that child available now.
CREATE TABLE cyclone.child_wakes (
    run_id        uuid        PRIMARY KEY REFERENCES cyclone.runs ON DELETE CASCADE,
    parent_run_id uuid        NOT NULL,
    created_at    timestamptz NOT NULL
);

-- CompleteMany on a sharded database: the outcomes p_items (step_complete_many's
-- items) of runs all on the shard of p_run_id (any of them), and their log lines
-- p_logs (step_logs_add's items, or NULL), in one call. Distributed by p_run_id, a
-- call is delegated whole to the node holding that shard and is one single-shard
-- transaction there: one round trip from the server. The items are applied as
-- step_complete_many applies them: a first pass locks the runs and applies every
-- success whose lease holds in one statement, closes runs by count and settles the
-- others (the first pass only where the call was delegated, on the shards' node);
-- then each item left (step_abandon, step_fail or _step_complete, in (run_id, node)
-- order) in its own subtransaction so that a refusal stands alone in its row. What the
-- call owes others once it commits is left in its transaction's settings, which the
-- server's statement reads: cyclone.ready, the actions it made claimable, and
-- cyclone.woken, the "parent:child" pairs of the child runs it finished on a worker
-- node (child_wakes). RPC: CompleteMany and Complete, on Citus.
CREATE FUNCTION cyclone.step_complete_shard(p_run_id uuid, p_items jsonb, p_logs jsonb)
RETURNS TABLE (i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, error_state text, error_message text,
               error_detail text)
LANGUAGE plpgsql
-- Each item's step is found by its key (step_complete_many says why).
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz;
    v_item     jsonb;
    v_done     cyclone.completion;
    -- The shards of p_run_id's group that this node holds (runs, steps), when the call
    -- was delegated here: the first pass reads and writes them as the plain tables they
    -- are, each statement planned by Postgres once per session (_prepared), where Citus
    -- plans a statement on a distributed table twice (as a distributed query, then its
    -- shard's) at every call.
    v_shards   text[];
    v_applied  integer[] := '{}';
    v_run      uuid[];
    v_node     text[];
    v_has_deps boolean[];
    v_keyed    text[];
    v_statuses jsonb := '{}';
    v_closed   record;
    v_closes   record;
    v_group    record;
    v_status   text;
    v_mode     text := current_setting('plan_cache_mode');
BEGIN
    IF p_logs IS NOT NULL THEN
        PERFORM cyclone.step_logs_add(p_logs);
    END IF;
    IF cyclone.sharded() THEN
        v_shards := ARRAY(SELECT format('cyclone.%I', t.name || '_'
                                        || get_shard_id_for_distribution_column(
                                               ('cyclone.' || t.name)::regclass, p_run_id))
                            FROM unnest(ARRAY['runs', 'steps']) WITH ORDINALITY AS t(name, n)
                           ORDER BY t.n);
        IF EXISTS (SELECT 1 FROM unnest(v_shards) s WHERE to_regclass(s) IS NULL) THEN
            v_shards := NULL;  -- not delegated: the shards are elsewhere
        END IF;
    END IF;
    IF v_shards IS NOT NULL THEN
        v_now := cyclone._now_here();
        -- The first pass, as step_complete_many's: lock the runs in run_id order, then
        -- every success whose lease holds in one statement. Its statements look rows
        -- up by key in one shard's tables: their plans are generic, made once per
        -- session, where Postgres would otherwise plan some of them again at every
        -- call for the values given. Set for these statements only: the functions
        -- called between them plan on the distributed tables with their arguments'
        -- values (service/sql/citus.sql).
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
        EXECUTE format('EXECUTE %I(%L)',
            cyclone._prepared('uuid[]', format(
                'SELECT 1 FROM %s r WHERE r.run_id = ANY ($1) ORDER BY r.run_id'
                ' FOR NO KEY UPDATE', v_shards[1])),
            ARRAY(SELECT DISTINCT (e->>'run_id')::uuid FROM jsonb_array_elements(p_items) e));
        EXECUTE format('EXECUTE %I(%L, %L)', cyclone._prepared('jsonb, timestamptz', format($q$
            WITH done AS (
                UPDATE %s s
                   SET status = 'completed', output = coalesce(t.e->'output', 'null'::jsonb),
                       finished_at = $2, lease_expires_at = NULL
                  FROM jsonb_array_elements($1) t(e)
                 WHERE NOT t.e ? 'failure'
                   AND s.run_id = (t.e->>'run_id')::uuid AND s.node = t.e->>'node'
                   AND s.lease_token::text = t.e->>'lease_token'
                   AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > $2 END
                RETURNING (t.e->>'i')::integer AS i, s.run_id, s.node,
                          cardinality(s.dependents) > 0 AS has_deps, s.action,
                          s.concurrency_key)
            SELECT coalesce(array_agg(i), '{}'), coalesce(array_agg(run_id), '{}'),
                   coalesce(array_agg(node), '{}'), coalesce(array_agg(has_deps), '{}'),
                   coalesce(array_agg(DISTINCT action)
                                FILTER (WHERE concurrency_key IS NOT NULL), '{}')
              FROM done
        $q$, v_shards[2])), p_items, v_now)
          INTO v_applied, v_run, v_node, v_has_deps, v_keyed;
        PERFORM set_config('plan_cache_mode', v_mode, true);
        -- A slot of a key is free: its action's claims look again (_key_wake on a
        -- worker node: a key is not counted across shards here).
        PERFORM cyclone._notify_ready(v_keyed);
        -- Runs where no completed step has a dependent: closed by the count, as
        -- _runs_close closes them; a child that finishes owes its parent a wake.
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
        EXECUTE format('EXECUTE %I(%L, %L, %L)',
            cyclone._prepared('uuid[], boolean[], timestamptz', format($q$
          WITH closed AS (
            UPDATE %1$s r
               SET steps_open = r.steps_open - c.closed, updated_at = $3,
                   status = CASE WHEN NOT c.closing THEN r.status
                                 WHEN c.error IS NULL THEN 'completed' ELSE 'failed' END,
                   finished_at = CASE WHEN c.closing THEN $3 ELSE r.finished_at END,
                   error = coalesce(c.error, r.error)
              FROM (SELECT c.run_id, c.closed, x.closing,
                           CASE WHEN x.closing THEN (
                               SELECT jsonb_build_object(
                                          'kind', 'StepDiscarded',
                                          'message', format('node %%s was discarded at attempt %%s',
                                                            s.node, s.attempt),
                                          'node', s.node, 'attempt', s.attempt,
                                          'started_at', s.started_at)
                                 FROM %2$s s
                                WHERE s.run_id = c.run_id AND s.status = 'discarded'
                                ORDER BY s.finished_at, s.node LIMIT 1) END AS error
                      FROM (SELECT d.run_id, count(*)::integer AS closed
                              FROM unnest($1::uuid[], $2::boolean[]) d(run_id, has_deps)
                             GROUP BY d.run_id HAVING NOT bool_or(d.has_deps)) c
                     CROSS JOIN LATERAL (
                           SELECT x.steps_open <= c.closed AND x.status = 'running' AS closing
                             FROM %1$s x WHERE x.run_id = c.run_id OFFSET 0) x
                    OFFSET 0) c
             WHERE r.run_id = c.run_id
            RETURNING r.run_id, r.status, r.parent_run_id, c.closing)
          SELECT array_agg(run_id) AS runs, array_agg(status) AS statuses,
                 array_agg(parent_run_id) AS parents, array_agg(closing) AS closings
            FROM closed
        $q$, v_shards[1], v_shards[2])), v_run, v_has_deps, v_now)
          INTO v_closes;
        PERFORM set_config('plan_cache_mode', v_mode, true);
        FOR v_closed IN
            SELECT * FROM unnest(v_closes.runs, v_closes.statuses, v_closes.parents,
                                 v_closes.closings) AS c(run_id, status, parent_run_id, closing)
        LOOP
            v_status := v_closed.status;
            IF v_closed.closing AND v_closed.parent_run_id IS NOT NULL THEN
                v_status := cyclone._child_finished(v_closed.run_id, v_closed.parent_run_id,
                                                    v_status);
            END IF;
            IF v_status IS DISTINCT FROM 'completed' THEN
                v_statuses := v_statuses || jsonb_build_object(v_closed.run_id::text, v_status);
            END IF;
        END LOOP;
        -- Runs with dependents to count: one graph walk per run, with all its finals.
        FOR v_group IN
            SELECT d.run_id, array_agg(d.node) AS nodes
              FROM unnest(v_run, v_node, v_has_deps) d(run_id, node, has_deps)
             GROUP BY d.run_id HAVING bool_or(d.has_deps)
             ORDER BY d.run_id
        LOOP
            v_status := cyclone._settle(v_group.run_id, v_group.nodes, '{}',
                                        cardinality(v_group.nodes));
            IF v_status IS DISTINCT FROM 'completed' THEN
                v_statuses := v_statuses || jsonb_build_object(v_group.run_id::text, v_status);
            END IF;
        END LOOP;
        RETURN QUERY
            SELECT d.i, 'completed'::text,
                   coalesce(v_statuses->>(d.run_id::text), 'completed'), false,
                   NULL::timestamptz, NULL::text, NULL::text, NULL::text
              FROM unnest(v_applied, v_run) d(i, run_id);
    END IF;
    -- The rest, each in its own subtransaction so that a refusal stands alone: failures,
    -- and successes the first pass did not apply (a lost lease, a repeat, an unknown
    -- step), which _step_complete then explains; every item when not delegated.
    FOR v_item IN
        SELECT e FROM jsonb_array_elements(p_items) e
         WHERE NOT (e->>'i')::integer = ANY (v_applied)
         ORDER BY e->>'run_id', e->>'node', (e->>'i')::integer
    LOOP
        i := (v_item->>'i')::integer;
        BEGIN
            IF (v_item->'failure'->>'uncertain')::boolean THEN
                v_done := cyclone.step_abandon(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'failure'->>'type', v_item->'failure'->>'message',
                    v_item->'failure'->>'details');
            ELSIF v_item ? 'failure' THEN
                v_done := cyclone.step_fail(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'failure'->>'type', v_item->'failure'->>'message',
                    v_item->'failure'->>'details', (v_item->'failure'->>'retryable')::boolean,
                    make_interval(secs => (v_item->'failure'->>'retry_after_s')::float8));
            ELSE
                v_done := cyclone._step_complete(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'output');
            END IF;
            step_status := v_done.step_status;
            run_status := v_done.run_status;
            duplicate := v_done.duplicate;
            retry_at := v_done.retry_at;
            error_state := NULL;
            error_message := NULL;
            error_detail := NULL;
        EXCEPTION WHEN SQLSTATE 'CY001' OR SQLSTATE 'CY002' OR SQLSTATE 'CY003' THEN
            GET STACKED DIAGNOSTICS error_state = RETURNED_SQLSTATE,
                                    error_message = MESSAGE_TEXT,
                                    error_detail = PG_EXCEPTION_DETAIL;
            step_status := NULL;
            run_status := NULL;
            duplicate := NULL;
            retry_at := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Wakes the nodes of run p_run_id that wait for its child p_child (_wake_waiting), after
-- the child's finish committed on another shard (child_wakes). Distributed by
-- p_run_id: delegated to the parent's node. Called by the server after a completion
-- that finished a child, and for the rows child_wakes_pending finds.
CREATE FUNCTION cyclone.child_wake(p_run_id uuid, p_child uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cyclone._wake_waiting(p_run_id, 'child ' || p_child);
END;
$$;

-- Forgets the parent wake that child run p_run_id owed, once child_wake delivered it.
-- Distributed by p_run_id: delegated to the child's node.
CREATE FUNCTION cyclone.child_wake_done(p_run_id uuid) RETURNS void
-- PL/pgSQL: Citus cannot plan a SQL function's statement with parameters.
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM cyclone.child_wakes w WHERE w.run_id = p_run_id;
END;
$$;

-- Up to p_limit parent wakes still owed (child_wakes), oldest first: the ones whose
-- delivery a crash or an unreachable node interrupted. Read by each server's sweep,
-- which delivers them (child_wake, then child_wake_done).
CREATE FUNCTION cyclone.child_wakes_pending(p_limit integer)
RETURNS TABLE (run_id uuid, parent_run_id uuid)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT w.run_id, w.parent_run_id FROM cyclone.child_wakes w
                  ORDER BY w.created_at LIMIT p_limit;
END;
$$;

-- The read of up to $4 ready steps of these actions in one shard whose tables this
-- node holds (p_tables: its steps, step_calls and runs; p_shard its id), in claim
-- order, no locks, with their priority and due time so that shards' answers can be
-- merged in claim order: a statement to EXECUTE with $1 the actions, $2 now, $3 the
-- actions passed over (_claim_shut), $4 the limit, $5 the rated actions, $6 the
-- worker's builds, $7 the paused workflows. Each action's steps are walked in claim
-- order along steps_ready_idx, $4 at most, as step_claim walks them: a read of
-- "action = ANY ($1)" in claim order read and sorted every ready step of the shard.
-- Keys already full are not passed over (step_claim_flow counts them under their
-- locks). PL/pgSQL, which keeps its statement parsed for the session, where an SQL
-- function's body is parsed at every call. Called by step_candidates_on and
-- step_candidates_local.
CREATE FUNCTION cyclone._step_candidates_sql(p_tables text[], p_shard bigint)
RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN format($q$(
        SELECT c.*
          FROM (SELECT DISTINCT x FROM unnest($1) x WHERE x <> ALL ($3)) AS a(action)
         CROSS JOIN LATERAL (
               SELECT s.run_id, s.node, s.action, %4$s::bigint AS shard,
                      s.concurrency_key, s.concurrency_limit,
                      s.concurrency_key IS NOT NULL OR s.action = ANY ($5) AS flow,
                      s.priority, s.available_at
                 FROM %1$s s
                WHERE s.status = 'available' AND s.action = a.action
                  AND s.available_at <= $2
                  AND cyclone._build_admits(s.build_id, $6, EXISTS (
                          SELECT 1 FROM %2$s j
                           WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0))
                  -- The run looked up by key while a workflow is paused (a scalar
                  -- lookup, as in step_claim: NOT EXISTS became a hashed subplan
                  -- that read every run of the shard).
                  AND (cardinality($7) = 0
                       OR (SELECT w.workflow FROM %3$s w
                            WHERE w.run_id = s.run_id OFFSET 0) <> ALL ($7))
                ORDER BY s.priority DESC, s.available_at
                LIMIT $4) c
         ORDER BY c.priority DESC, c.available_at
         LIMIT $4)$q$, p_tables[1], p_tables[2], p_tables[3], p_shard);
END;
$$;

-- The actions a claim passes over: paused ones (75_pauses.sql) and, of the rated ones
-- the worker declares (p_rate_actions, p_rate_counts per p_rate_periods seconds), those
-- whose window is full as last written. Called by step_candidates_on and
-- step_candidates_local.
CREATE FUNCTION cyclone._claim_shut(
    p_now timestamptz, p_rate_actions text[], p_rate_counts integer[],
    p_rate_periods float8[])
RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'action')
           || ARRAY(SELECT r.action
                      FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods)
                           AS r(action, count, period)
                      JOIN cyclone.action_rates t ON t.action = r.action
                     WHERE (SELECT coalesce(sum(b.n), 0)
                              FROM unnest(t.lasts, t.counts) AS b(last, n)
                             WHERE b.last > p_now - make_interval(secs => r.period))
                           >= r.count);
$$;

-- step_candidates_sharded for the one shard of p_run_id, when a multi-shard read cannot
-- be made (a worker node is down): up to p_limit ready steps of these actions on that
-- shard (_step_candidates_sql). Distributed by p_run_id (any run id of the shard):
-- delegated whole to the shard's node, which reads its tables directly. Called by the
-- server for each shard while the read across shards fails, so that the runs on the
-- nodes that are up go on. The rates' periods are seconds: Citus delegates a call only
-- when its arguments are plain values.
CREATE FUNCTION cyclone.step_candidates_on(
    p_run_id uuid, p_actions text[], p_limit integer, p_rate_actions text[],
    p_rate_counts integer[], p_rate_periods float8[], p_builds text[] DEFAULT '{}')
RETURNS TABLE (run_id uuid, node text, action text, shard bigint, concurrency_key text,
               concurrency_limit integer, flow boolean, priority integer,
               available_at timestamptz)
-- Volatile: it may prepare its statement (_prepared). The read's plan is generic,
-- made once per session: Postgres would otherwise plan it again at every call for the
-- values given (its LIMIT among them).
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now    timestamptz := cyclone.now();
    v_shard  bigint := 0;
    v_tables text[] := ARRAY['cyclone.steps', 'cyclone.step_calls', 'cyclone.runs'];
BEGIN
    IF cyclone.sharded() THEN
        v_shard := get_shard_id_for_distribution_column('cyclone.runs', p_run_id);
        v_tables := ARRAY(SELECT format('cyclone.%I', t.name || '_'
                                        || get_shard_id_for_distribution_column(
                                               ('cyclone.' || t.name)::regclass, p_run_id))
                            FROM unnest(ARRAY['steps', 'step_calls', 'runs'])
                                 WITH ORDINALITY AS t(name, i)
                           ORDER BY t.i);
        IF EXISTS (SELECT 1 FROM unnest(v_tables) n WHERE to_regclass(n) IS NULL) THEN
            RETURN;  -- not on the shard's node: nothing is read
        END IF;
    END IF;
    RETURN QUERY EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L)',
        cyclone._prepared('text[], timestamptz, text[], integer, text[], text[], text[]',
                          cyclone._step_candidates_sql(v_tables, v_shard)),
        p_actions, v_now,
        cyclone._claim_shut(v_now, p_rate_actions, p_rate_counts, p_rate_periods),
        p_limit, p_rate_actions, p_builds,
        ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'workflow'));
END;
$$;

-- The claim's first read on one node, by a server that sends each node its part
-- (--citus-route): up to p_limit ready steps of these actions in the shards of the runs
-- that this node holds, in claim order (one statement over each shard's tables,
-- _step_candidates_sql; the server merges the nodes' answers). Not delegated: called
-- on each node that holds shards, it reads that node's shards' tables directly,
-- without a multi-shard query through the coordinator. Nothing on a node that holds
-- none, or on a database that is not distributed.
CREATE FUNCTION cyclone.step_candidates_local(
    p_actions text[], p_limit integer, p_rate_actions text[], p_rate_counts integer[],
    p_rate_periods float8[], p_builds text[] DEFAULT '{}')
RETURNS TABLE (run_id uuid, node text, action text, shard bigint, concurrency_key text,
               concurrency_limit integer, flow boolean, priority integer,
               available_at timestamptz)
-- Volatile: it may prepare its statement (_prepared). The read's plan is generic,
-- made once per session: Postgres would otherwise plan it again at every call for the
-- values given (its LIMIT among them).
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now    timestamptz;
    v_sql    text;
    v_refs   text[];
    v_shut   text[];
    v_paused text[];
BEGIN
    IF NOT cyclone.sharded() THEN
        RETURN;
    END IF;
    -- cyclone.now() and the pauses from this node's copies of the clock and the
    -- pauses (_here); the actions passed over are the paused ones (_claim_shut) and,
    -- when the worker declares rated actions, those whose window is full.
    v_refs := cyclone._here(ARRAY['clock', 'pauses']);
    EXECUTE format($q$
        SELECT statement_timestamp() + c.offset_by,
               ARRAY(SELECT p.name FROM %2$s p WHERE p.kind = 'action'),
               ARRAY(SELECT p.name FROM %2$s p WHERE p.kind = 'workflow')
          FROM %1$s c$q$, v_refs[1], v_refs[2])
       INTO v_now, v_shut, v_paused;
    IF cardinality(p_rate_actions) > 0 THEN
        v_shut := cyclone._claim_shut(v_now, p_rate_actions, p_rate_counts, p_rate_periods);
    END IF;
    -- Each shard of the runs placed on this node, with the shards of steps and
    -- step_calls co-located with it (the same hash range).
    SELECT string_agg(cyclone._step_candidates_sql(x.tables, x.shard), ' UNION ALL ')
      INTO v_sql
      FROM (SELECT s.shardid AS shard,
                   ARRAY(SELECT format('cyclone.%I', t.name || '_' || c.shardid)
                           FROM unnest(ARRAY['steps', 'step_calls'])
                                WITH ORDINALITY AS t(name, i)
                           JOIN pg_dist_shard c
                             ON c.logicalrelid = ('cyclone.' || t.name)::regclass
                            AND c.shardminvalue = s.shardminvalue
                          ORDER BY t.i)
                   || format('cyclone.%I', 'runs_' || s.shardid) AS tables
              FROM pg_dist_shard s
              JOIN pg_dist_placement p ON p.shardid = s.shardid
             WHERE s.logicalrelid = 'cyclone.runs'::regclass
               AND p.groupid = (SELECT l.groupid FROM pg_dist_local_group l)) x;
    IF v_sql IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L)',
        cyclone._prepared('text[], timestamptz, text[], integer, text[], text[], text[]',
                          'SELECT * FROM (' || v_sql
                          || ') c ORDER BY c.priority DESC, c.available_at LIMIT $4'),
        p_actions, v_now, v_shut, p_limit, p_rate_actions, p_builds, v_paused);
END;
$$;

-- step_candidates_local for the worker p_worker, as the server that sends each node
-- its part (--citus-route) asks for it: nothing for a worker whose lease lapsed, as
-- worker_health says on this node's copy (_here), read by a prepared statement; a
-- statement that named worker_health itself would be planned by Citus as a
-- distributed query and run from text at every call (0.2 ms). Not delegated.
CREATE FUNCTION cyclone.step_candidates_node(
    p_worker text, p_actions text[], p_limit integer, p_rate_actions text[],
    p_rate_counts integer[], p_rate_periods float8[], p_builds text[] DEFAULT '{}')
RETURNS TABLE (run_id uuid, node text, action text, shard bigint, concurrency_key text,
               concurrency_limit integer, flow boolean, priority integer,
               available_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_lapsed boolean;
BEGIN
    EXECUTE format('EXECUTE %I(%L)', cyclone._prepared('text', format(
        'SELECT EXISTS (SELECT 1 FROM %s h WHERE h.worker_id = $1)',
        (cyclone._here(ARRAY['worker_health']))[1])), p_worker)
       INTO v_lapsed;
    IF v_lapsed THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT * FROM cyclone.step_candidates_local(p_actions, p_limit, p_rate_actions,
                                                p_rate_counts, p_rate_periods, p_builds);
END;
$$;

-- The tables p_names co-located with the runs' shard p_shard as this node holds them
-- (their shards of the same hash range, by name), in the order of p_names; NULL when
-- any of them is not on this node (the shard moved away, or this is not its node).
-- Called by step_claim_node and step_complete_node, once for each shard of their call.
CREATE FUNCTION cyclone._local_tables(p_shard bigint, p_names text[]) RETURNS text[]
-- PL/pgSQL: Citus's catalog is not there on a database that is not distributed.
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT CASE WHEN count(*) = cardinality(p_names)
                             AND bool_and(to_regclass(x.name) IS NOT NULL)
                        THEN array_agg(x.name ORDER BY x.i) END
              FROM (SELECT t.i, format('cyclone.%I', t.name || '_' || c.shardid) AS name
                      -- Each name cast once, as in _here.
                      FROM (SELECT u.name, u.i, ('cyclone.' || u.name)::regclass AS rel
                              FROM unnest(p_names) WITH ORDINALITY AS u(name, i)
                            OFFSET 0) t
                      JOIN pg_dist_shard r ON r.shardid = p_shard
                      JOIN pg_dist_placement l
                        ON l.shardid = r.shardid
                       AND l.groupid = (SELECT g.groupid FROM pg_dist_local_group g)
                      JOIN pg_dist_shard c
                        ON c.logicalrelid = t.rel AND c.shardminvalue = r.shardminvalue) x);
END;
$$;

-- A claim's part of every shard that one node holds, in one call and one transaction
-- on that node, by a server that sends each node its part (--citus-route): the
-- candidates p_runs / p_nodes (aligned with their shards p_shards, in claim order)
-- taken shard by shard, in that order, as step_claim_shard takes each shard's. Not
-- delegated: called on the node that holds the shards. What step_claim_shard does
-- for each shard (the clock read, the shards' names) is done here once for them all,
-- and each shard's runs are taken by one prepared statement (_step_claim_sql) on its
-- tables. A shard that moved away meanwhile, and every shard when the worker marks
-- actions unsafe, goes through step_claim_shard (run by run through the distributed
-- tables, step_claim_run, from wherever the shard now is). One round trip and one
-- commit per node instead of per shard. RPC: Claim and Work, on Citus.
CREATE FUNCTION cyclone.step_claim_node(
    p_runs uuid[], p_nodes text[], p_shards bigint[], p_worker text, p_unsafe text[],
    p_lease interval, p_build text DEFAULT NULL, p_builds text[] DEFAULT '{}')
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb, run_deadline timestamptz, traceparent text)
LANGUAGE plpgsql
-- As step_claim_shard's.
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_group record;
    v_refs  text[];
    v_now   timestamptz;
BEGIN
    IF cardinality(p_unsafe) = 0 THEN
        v_now := cyclone._now_here();
        v_refs := cyclone._here(ARRAY['worker_health']);  -- this node's copy
    END IF;
    FOR v_group IN
        SELECT array_agg(u.r ORDER BY u.i) AS runs, array_agg(u.n ORDER BY u.i) AS nodes,
               CASE WHEN cardinality(p_unsafe) = 0
                    THEN cyclone._local_tables(u.s, ARRAY['steps', 'step_calls',
                                                          'step_errors', 'runs']) END
                   AS tables
          FROM unnest(p_runs, p_nodes, p_shards) WITH ORDINALITY AS u(r, n, s, i)
         GROUP BY u.s
         ORDER BY min(u.i)
    LOOP
        IF v_group.tables IS NULL THEN
            RETURN QUERY
            SELECT * FROM cyclone.step_claim_shard(v_group.runs[1], v_group.runs,
                                                   v_group.nodes, p_worker, p_unsafe,
                                                   p_lease, p_build, p_builds);
        ELSE
            RETURN QUERY EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L, %L)',
                cyclone._prepared(
                    'uuid[], text[], uuid[], timestamptz, text, interval, text, text[]',
                    cyclone._step_claim_sql(v_group.tables || v_refs)),
                v_group.runs, v_group.nodes,
                ARRAY(SELECT gen_random_uuid() FROM unnest(v_group.nodes)), v_now,
                p_worker, p_lease, p_build, p_builds);
        END IF;
    END LOOP;
END;
$$;

-- The outcomes of every shard that one node holds, in one call and one transaction on
-- that node (--citus-route): p_items as step_complete_shard's, p_shards the shard of
-- each (by its "i"), applied shard by shard in shard order, each as step_complete_shard
-- applies a shard's (its runs locked in run_id order: two such calls, or one and a
-- shard's own, lock runs in the same order and never wait on each other in a cycle).
-- Not delegated, as step_claim_node. Answers as step_complete_shard's, for every item.
-- RPC: CompleteMany and Work, on Citus.
CREATE FUNCTION cyclone.step_complete_node(p_items jsonb, p_shards bigint[], p_logs jsonb)
RETURNS TABLE (i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, error_state text, error_message text,
               error_detail text)
LANGUAGE plpgsql AS $$
DECLARE
    v_group record;
BEGIN
    IF p_logs IS NOT NULL THEN
        PERFORM cyclone.step_logs_add(p_logs);
    END IF;
    FOR v_group IN
        SELECT jsonb_agg(e ORDER BY (e->>'i')::integer) AS items
          FROM jsonb_array_elements(p_items) e
         GROUP BY p_shards[(e->>'i')::integer + 1]
         ORDER BY p_shards[(e->>'i')::integer + 1]
    LOOP
        RETURN QUERY
        SELECT * FROM cyclone.step_complete_shard((v_group.items->0->>'run_id')::uuid,
                                                  v_group.items, NULL);
    END LOOP;
END;
$$;
