-- Postgres's cost per step: no journal lookup at a first claim, and no last pass in
-- step_complete_many when every item was applied (docs/performance.md, "The engine's
-- SQL").
--
-- The claim reads a claimed step's journal only when the step was claimed before: a
-- first claim (attempt 1) has none, since every journal entry is written under a lease.
-- step_complete_many skips its pass over the remaining items when the set-based pass
-- applied all of them.
CREATE OR REPLACE FUNCTION cyclone.step_claim(
    p_worker text, p_actions text[], p_unsafe text[], p_limit integer, p_lease interval,
    p_rate_actions text[] DEFAULT '{}', p_rate_counts integer[] DEFAULT '{}',
    p_rate_periods interval[] DEFAULT '{}')
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb)
LANGUAGE plpgsql
-- The plan is the same walk of the ready index for every argument (see above).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    -- The rate-limited actions, and the room left in the window of each.
    v_rated text[] := '{}';
    v_rooms integer[] := '{}';
BEGIN
    IF cardinality(p_unsafe) = 0 THEN
        -- No step of this claim is unsafe to repeat: its commit does not wait for the
        -- WAL flush (see above).
        PERFORM set_config('synchronous_commit', 'off', true);
    ELSE
        RETURN QUERY SELECT b.run_id, b.node, b.action, b.workflow, b.attempt, b.max_attempts,
                            NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::uuid,
                            NULL::timestamptz, NULL::timestamptz, NULL::jsonb, true, true,
                            NULL::float8, NULL::jsonb, NULL::jsonb
                       FROM cyclone._block_uncertain(p_unsafe) b;
    END IF;

    IF cardinality(p_rate_actions) > 0 THEN
        -- Locked in action order, so that two claims never wait on each other.
        SELECT array_agg(o.action), array_agg(o.room) INTO v_rated, v_rooms
          FROM (SELECT r.action, cyclone._rate_room(r.action, r.count, r.period, v_now) AS room
                  FROM (SELECT * FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods)
                                   AS r(action, count, period)
                         ORDER BY r.action OFFSET 0) r) o;
    END IF;

    RETURN QUERY
    WITH picked AS (
        SELECT c.row_id, c.run_id, c.node, c.effect_uncertain, c.available_at, c.priority,
               c.concurrency_key, c.concurrency_limit, c.waiting_for
          FROM (SELECT x.action,
                       least(p_limit, coalesce(v_rooms[array_position(v_rated, x.action)],
                                               p_limit)) AS room
                  FROM (SELECT DISTINCT x FROM unnest(p_actions) x) AS x(action)) AS a
         CROSS JOIN LATERAL (
               SELECT s.ctid AS row_id, s.run_id, s.node, s.available_at, s.effect_uncertain,
                      s.priority, s.concurrency_key, s.concurrency_limit, s.waiting_for
                 FROM cyclone.steps s
                WHERE s.status = 'available' AND s.action = a.action
                  AND s.available_at <= v_now
                  AND NOT (s.effect_uncertain AND s.action = ANY (p_unsafe))
                  -- Pass over the keys already full as this statement sees them: listed
                  -- once per claim, when the walk first meets a keyed step.
                  AND (s.concurrency_key IS NULL
                       OR s.concurrency_key <> ALL (ARRAY(
                              SELECT k.concurrency_key FROM cyclone.steps k
                               WHERE k.status = 'running' AND k.concurrency_key IS NOT NULL
                               GROUP BY k.concurrency_key
                              HAVING count(*) >= min(k.concurrency_limit))))
                ORDER BY s.priority DESC, s.available_at
                LIMIT a.room
                  FOR UPDATE SKIP LOCKED) c
         ORDER BY c.priority DESC, c.available_at
         LIMIT p_limit
    ), keyed AS MATERIALIZED (
        -- The room of each key picked, counted under the keys' locks (_keys_room).
        SELECT r.concurrency_key, r.room
          FROM (SELECT array_agg(k.concurrency_key) AS keys, array_agg(k.lim) AS limits
                  FROM (SELECT p.concurrency_key, min(p.concurrency_limit) AS lim
                          FROM picked p WHERE p.concurrency_key IS NOT NULL
                         GROUP BY p.concurrency_key) k) g
         CROSS JOIN LATERAL cyclone._keys_room(g.keys, g.limits) r
         WHERE g.keys IS NOT NULL
    ), admitted AS (
        SELECT p.row_id, p.run_id, p.node, p.effect_uncertain, p.available_at,
               p.waiting_for = 'sleep' AS slept
          FROM picked p WHERE p.concurrency_key IS NULL
        UNION ALL
        SELECT p.row_id, p.run_id, p.node, p.effect_uncertain, p.available_at,
               p.waiting_for = 'sleep'
          FROM (SELECT p.*, row_number() OVER (PARTITION BY p.concurrency_key
                                               ORDER BY p.priority DESC, p.available_at) AS n
                  FROM picked p WHERE p.concurrency_key IS NOT NULL) p
          JOIN keyed k ON k.concurrency_key = p.concurrency_key
         WHERE p.n <= k.room
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
               effect_uncertain = false,
               -- A node claimed at its wake time has slept: see slept below.
               waiting_for = CASE WHEN s.waiting_for = 'sleep' THEN NULL
                                  ELSE s.waiting_for END
         -- The rows picked locked, by their ctids alone: no status condition here,
         -- which would let the planner read them through steps_ready_idx instead, a
         -- walk of every ready row (statistics taken while few rows were ready, as
         -- before a fan-out is released, make it look cheaper than the TID scan).
         WHERE s.ctid = ANY (ARRAY(SELECT p.row_id FROM admitted p))
        RETURNING s.run_id, s.node, s.action, s.attempt, s.max_attempts, s.input,
                  s.depends_on, s.deps_failed, s.lease_token, s.lease_expires_at,
                  s.deadline_at, s.progress
    ), slept AS (
        -- A sleep is over once its node is claimed at or after the wake time: its
        -- journal entry succeeds here, as step_wait would record it when the body's
        -- replay reached the sleep, so the replay needs no Wait to go past it.
        UPDATE cyclone.step_calls j
           SET status = 'succeeded', output = 'null', finished_at = v_now,
               attempt = c.attempt
          FROM claimed c
          JOIN admitted p ON p.run_id = c.run_id AND p.node = c.node AND p.slept
         WHERE j.run_id = c.run_id AND j.node = c.node
           AND j.status = 'waiting' AND j.function = 'cyclone.sleep'
           AND j.wake_at <= v_now
        RETURNING j.*
    ), rated AS (
        -- The claims of each rate-limited action join its window (locked by _rate_room).
        UPDATE cyclone.action_rates t
           SET (firsts, lasts, counts, reopens_at) = (
                   SELECT n.firsts, n.lasts, n.counts, n.reopens_at
                     FROM cyclone._rate_next(t.firsts, t.lasts, t.counts, r.count, r.period,
                                             v_now, r.n) n),
               updated_at = v_now
          FROM (SELECT r.action, r.count, r.period, c.n
                  FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods)
                       AS r(action, count, period)
                  JOIN (SELECT c.action, count(*)::integer AS n FROM claimed c
                         GROUP BY c.action) c ON c.action = r.action
                 WHERE cardinality(p_rate_actions) > 0) r
         WHERE t.action = r.action
    )
    SELECT c.run_id, c.node, c.action, r.workflow, c.attempt, c.max_attempts, c.input,
           r.input,
           CASE WHEN cardinality(c.depends_on) > 0 THEN (
               SELECT jsonb_object_agg(u.node, u.output) FROM cyclone.steps u
                WHERE u.run_id = c.run_id AND u.node = ANY (c.depends_on)
                  AND u.status = 'completed') END,
           c.lease_token, c.lease_expires_at, c.deadline_at, c.progress,
           p.effect_uncertain, false, extract(epoch FROM v_now - p.available_at)::float8,
           CASE WHEN c.deps_failed > 0 THEN (
               SELECT jsonb_agg(jsonb_build_object(
                          'node', u.node, 'status', u.status,
                          'error', CASE WHEN u.status = 'discarded' THEN (
                              SELECT jsonb_build_object(
                                         'attempt', e.attempt, 'kind', e.kind, 'type', e.type,
                                         'message', e.message, 'details', e.details,
                                         'retryable', e.retryable, 'at', e.at)
                                FROM cyclone.step_errors e
                               WHERE e.run_id = u.run_id AND e.node = u.node
                               ORDER BY e.at DESC, e.attempt DESC LIMIT 1) END)
                      ORDER BY u.position)
                 FROM cyclone.steps u
                WHERE u.run_id = c.run_id AND u.node = ANY (c.depends_on)
                  AND u.status IN ('discarded', 'skipped')) END,
           -- One probe of the journal's key per claimed step that was claimed before
           -- (a sleep that ended at this claim as slept left it: the statement still
           -- sees the old version). A first claim (attempt 1) has no journal: every
           -- entry is written under a lease (_step_held), so none before a first claim.
           CASE WHEN c.attempt > 1 THEN (SELECT jsonb_agg(cyclone._step_call_json(
                       CASE WHEN w.step_id IS NULL THEN j ELSE w::cyclone.step_calls END)
                       ORDER BY j.seq)
              FROM cyclone.step_calls j
              LEFT JOIN slept w ON p.slept AND w.run_id = j.run_id AND w.node = j.node
                               AND w.step_id = j.step_id
             WHERE j.run_id = c.run_id AND j.node = c.node) END
      FROM claimed c
      JOIN admitted p ON p.run_id = c.run_id AND p.node = c.node
     -- OFFSET 0 keeps the lookup a subquery run once per claimed step, by key.
     CROSS JOIN LATERAL (SELECT r.workflow, r.input FROM cyclone.runs r
                          WHERE r.run_id = c.run_id OFFSET 0) r;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone.step_claim_run(
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
           -- _step_call_json's shape; on Citus a shard's row has the shard's type. A
           -- first claim has no journal (step_claim).
           CASE WHEN c.attempt > 1 THEN (
               SELECT jsonb_agg(to_jsonb(j) - 'run_id' - 'node' ORDER BY j.seq)
                 FROM cyclone.step_calls j
                WHERE j.run_id = p_run_id AND j.node = c.node) END
      FROM cyclone.steps c
      JOIN unnest(v_nodes, v_tokens, v_unsure, v_since) AS t(node, token, uncertain, since)
        ON t.node = c.node AND t.token = c.lease_token
     CROSS JOIN (SELECT r.workflow, r.input FROM cyclone.runs r WHERE r.run_id = p_run_id) r
     WHERE c.run_id = p_run_id AND c.status = 'running';
END;
$$;

CREATE OR REPLACE FUNCTION cyclone.step_claim_shard(
    p_run_id uuid, p_runs uuid[], p_nodes text[], p_worker text, p_unsafe text[],
    p_lease interval)
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_run    uuid;
    v_nodes  text[];
    -- A lease token for each node of the run, drawn here: Citus refuses a volatile
    -- function in an UPDATE of a distributed table.
    v_tokens uuid[];
    -- The tables as this node holds them: on Citus the shards of p_run_id's group,
    -- which this call (delegated to their node) reads and writes as the plain tables
    -- they are, planned once per statement rather than twice.
    v_tables text[] := ARRAY['cyclone.steps', 'cyclone.step_calls', 'cyclone.step_errors',
                             'cyclone.runs'];
    v_shards text[];
    v_sql    text;
BEGIN
    IF cyclone.sharded() AND cardinality(p_unsafe) = 0 THEN
        v_shards := ARRAY(SELECT format('cyclone.%I', t.name || '_'
                                        || get_shard_id_for_distribution_column(
                                               ('cyclone.' || t.name)::regclass, p_run_id))
                            FROM unnest(ARRAY['steps', 'step_calls', 'step_errors', 'runs'])
                                 WITH ORDINALITY AS t(name, i)
                           ORDER BY t.i);
        -- Not delegated (called in a transaction block, or the shard moved meanwhile):
        -- the shards are elsewhere, and the distributed tables serve, planned by Citus.
        IF NOT EXISTS (SELECT 1 FROM unnest(v_shards) n WHERE to_regclass(n) IS NULL) THEN
            v_tables := v_shards;
        END IF;
    END IF;
    -- One statement per run; $1 the run, $2 its nodes, $3 their tokens, $4 the time,
    -- $5 the worker, $6 the lease; %1$s steps, %2$s step_calls, %3$s step_errors,
    -- %4$s runs.
    v_sql := format($q$
            WITH picked AS (
                SELECT s.node, t.token, s.effect_uncertain AS uncertain, s.available_at AS since,
                       s.waiting_for = 'sleep' AS slept, t.i
                  FROM %1$s s
                  JOIN unnest($2, $3) WITH ORDINALITY AS t(node, token, i)
                    ON t.node = s.node
                 WHERE s.run_id = $1 AND s.status = 'available' AND s.available_at <= $4
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
                                          ELSE s.waiting_for END
                  FROM picked p
                 WHERE s.run_id = $1 AND s.node = p.node
                RETURNING s.node, s.action, s.attempt, s.max_attempts, s.input, s.depends_on,
                          s.deps_failed, s.lease_token, s.lease_expires_at, s.deadline_at,
                          s.progress
            ), slept AS (
                -- As in step_claim: a sleep is over once its node is claimed at its wake time.
                UPDATE %2$s j
                   SET status = 'succeeded', output = 'null', finished_at = $4,
                       attempt = c.attempt
                  FROM claimed c JOIN picked p ON p.node = c.node AND p.slept
                 WHERE j.run_id = $1 AND j.node = c.node
                   AND j.status = 'waiting' AND j.function = 'cyclone.sleep'
                   AND j.wake_at <= $4
                RETURNING j.node, j.step_id
            )
            SELECT $1, c.node, c.action, r.workflow, c.attempt, c.max_attempts, c.input,
                   r.input,
                   CASE WHEN cardinality(c.depends_on) > 0 THEN (
                       SELECT jsonb_object_agg(u.node, u.output) FROM %1$s u
                        WHERE u.run_id = $1 AND u.node = ANY (c.depends_on)
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
                                       WHERE e.run_id = $1 AND e.node = u.node
                                       ORDER BY e.at DESC, e.attempt DESC LIMIT 1) END)
                              ORDER BY u.position)
                         FROM %1$s u
                        WHERE u.run_id = $1 AND u.node = ANY (c.depends_on)
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
                      LEFT JOIN slept w ON w.node = j.node AND w.step_id = j.step_id
                     WHERE j.run_id = $1 AND j.node = c.node) END
              FROM claimed c
              JOIN picked p ON p.node = c.node
             CROSS JOIN (SELECT r.workflow, r.input FROM %4$s r WHERE r.run_id = $1) r
             ORDER BY p.i
$q$, v_tables[1], v_tables[2], v_tables[3], v_tables[4]);
    FOR v_run IN
        SELECT u.r FROM unnest(p_runs) WITH ORDINALITY AS u(r, i) GROUP BY u.r ORDER BY min(u.i)
    LOOP
        v_nodes := ARRAY(SELECT u.n FROM unnest(p_runs, p_nodes) WITH ORDINALITY AS u(r, n, i)
                          WHERE u.r = v_run ORDER BY u.i);
        IF cardinality(p_unsafe) > 0 THEN
            RETURN QUERY
            SELECT * FROM cyclone.step_claim_run(v_run, v_nodes, p_worker, p_unsafe, p_lease);
            CONTINUE;
        END IF;
        v_tokens := ARRAY(SELECT gen_random_uuid() FROM unnest(v_nodes));
        RETURN QUERY EXECUTE v_sql USING v_run, v_nodes, v_tokens, v_now, p_worker, p_lease;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone.step_complete_many(p_items jsonb)
RETURNS TABLE (i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, error_state text, error_message text,
               error_detail text)
LANGUAGE plpgsql
-- Each item's step is found by its key. Left to itself, the planner hashes the whole
-- steps table for the batch's join while the table is small (a few thousand rows,
-- plus the dead versions that a busy table piles up between vacuums): in the waits
-- bench that was a sequential scan per batch, 1.5 million rows read for 3,000 runs.
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := cyclone.now();
    v_applied  integer[];
    v_run      uuid[];
    v_node     text[];
    v_has_deps boolean[];
    -- The completed steps with a concurrency key: their actions, keys and limits.
    v_keyed    text[];
    v_keys     text[];
    v_limits   integer[];
    v_statuses jsonb;
    v_group    record;
    v_item     jsonb;
    v_done     cyclone.completion;
BEGIN
    -- Lock every run of the batch in run_id order, the order every batch locks in, so
    -- that two batches cannot deadlock.
    PERFORM 1 FROM cyclone.runs r
     WHERE r.run_id = ANY (ARRAY(SELECT DISTINCT (e->>'run_id')::uuid
                                   FROM jsonb_array_elements(p_items) e))
     ORDER BY r.run_id
       FOR NO KEY UPDATE;

    -- Every success whose lease still holds, in one statement (as step_complete).
    WITH item AS (
        SELECT (e->>'i')::integer AS i, (e->>'run_id')::uuid AS run_id, e->>'node' AS node,
               (e->>'lease_token')::uuid AS lease_token, e->'output' AS output
          FROM jsonb_array_elements(p_items) e
         WHERE NOT e ? 'failure'
    ), done AS (
        UPDATE cyclone.steps s
           SET status = 'completed', output = coalesce(t.output, 'null'::jsonb),
               finished_at = v_now, lease_expires_at = NULL
          FROM item t
         WHERE s.run_id = t.run_id AND s.node = t.node AND s.lease_token = t.lease_token
           -- By key: see steps_leased_idx.
           AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
        RETURNING t.i, s.run_id, s.node, cardinality(s.dependents) > 0 AS has_deps,
                  s.action, s.concurrency_key, s.concurrency_limit
    )
    SELECT coalesce(array_agg(i), '{}'), coalesce(array_agg(run_id), '{}'),
           coalesce(array_agg(node), '{}'), coalesce(array_agg(has_deps), '{}'),
           coalesce(array_agg(action) FILTER (WHERE concurrency_key IS NOT NULL), '{}'),
           coalesce(array_agg(concurrency_key) FILTER (WHERE concurrency_key IS NOT NULL), '{}'),
           coalesce(array_agg(concurrency_limit) FILTER (WHERE concurrency_key IS NOT NULL),
                    '{}')
      INTO v_applied, v_run, v_node, v_has_deps, v_keyed, v_keys, v_limits
      FROM done;
    -- Slots of full concurrency keys are free: wake the claims of those steps' actions.
    IF cardinality(v_keys) > 0 THEN
        PERFORM cyclone._notify_ready(ARRAY(
            SELECT DISTINCT w.action
              FROM (SELECT k.action, k.key, min(k.lim) AS lim, count(*)::integer AS n
                      FROM unnest(v_keyed, v_keys, v_limits) AS k(action, key, lim)
                     GROUP BY k.action, k.key) k
             CROSS JOIN LATERAL (SELECT cyclone._key_wake(k.action, k.key, k.lim, k.n)
                                        AS action) w
             WHERE w.action IS NOT NULL));
    END IF;

    -- Runs where no completed step has a dependent: close them by the count, at once.
    SELECT coalesce(jsonb_object_agg(c.run_id, c.status), '{}') INTO v_statuses
      FROM (SELECT array_agg(g.run_id ORDER BY g.run_id) AS runs,
                   array_agg(g.n ORDER BY g.run_id) AS closed
              FROM (SELECT d.run_id, count(*)::integer AS n
                      FROM unnest(v_run, v_has_deps) d(run_id, has_deps)
                     GROUP BY d.run_id HAVING NOT bool_or(d.has_deps)) g) leaves,
           cyclone._runs_close(leaves.runs, leaves.closed, v_now) c;

    -- Runs with dependents to count: one graph walk per run, with all its finals.
    FOR v_group IN
        SELECT d.run_id, array_agg(d.node) AS nodes
          FROM unnest(v_run, v_node, v_has_deps) d(run_id, node, has_deps)
         GROUP BY d.run_id HAVING bool_or(d.has_deps)
         ORDER BY d.run_id
    LOOP
        v_statuses := v_statuses || jsonb_build_object(
            v_group.run_id::text,
            cyclone._settle(v_group.run_id, v_group.nodes, '{}', cardinality(v_group.nodes)));
    END LOOP;

    RETURN QUERY
        SELECT d.i, 'completed'::text, v_statuses->>(d.run_id::text), false,
               NULL::timestamptz, NULL::text, NULL::text, NULL::text
          FROM unnest(v_applied, v_run) d(i, run_id);

    -- The rest one at a time, each in its own subtransaction so that a refusal stands
    -- alone: failures, and successes the pass above did not apply (a lost lease, a
    -- repeated completion, an unknown step), which _step_complete then explains. None
    -- when the pass applied every item (an item names one step: one row each).
    IF cardinality(v_applied) = jsonb_array_length(p_items) THEN
        RETURN;
    END IF;
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
