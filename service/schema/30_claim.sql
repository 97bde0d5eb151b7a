-- Claim and Heartbeat: handing out ready steps under a lease, and keeping the lease.

-- Blocks the runs whose ready, uncertain step is of an action in p_unsafe: the step
-- becomes uncertain, the run blocked with an EffectUncertain error, and the run's
-- other ready steps are held (pending) until Resolve. Rows are taken with SKIP
-- LOCKED; a step whose run is locked (or not running) is left for a later claim.
-- Called by step_claim when the worker marks actions unsafe.
CREATE FUNCTION cyclone._block_uncertain(p_unsafe text[])
RETURNS TABLE (run_id uuid, node text, action text, workflow text, attempt integer,
               max_attempts integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := cyclone.now();
    v_step record;
BEGIN
    FOR v_step IN
        SELECT s.run_id, s.node, s.action, s.attempt, s.max_attempts, s.started_at
          FROM cyclone.steps s
         WHERE s.status = 'available' AND s.effect_uncertain AND s.action = ANY (p_unsafe)
           FOR UPDATE SKIP LOCKED
    LOOP
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM cyclone.runs r
             WHERE r.run_id = v_step.run_id AND r.status = 'running'
               FOR NO KEY UPDATE SKIP LOCKED);
        UPDATE cyclone.steps s SET status = 'uncertain'
         WHERE s.run_id = v_step.run_id AND s.node = v_step.node;
        workflow := cyclone._run_block(v_step.run_id, jsonb_build_object(
            'kind', 'EffectUncertain',
            'message', format(
                'node %s (action %s) lost its lease at attempt %s (started %s) with no '
                'outcome; its effect may have happened. Check, then resolve: cyclone '
                'resolve %s %s --result JSON | --error MSG | --discard', v_step.node,
                v_step.action, v_step.attempt, cyclone._when(v_step.started_at),
                v_step.run_id, v_step.node),
            'node', v_step.node, 'attempt', v_step.attempt,
            'started_at', v_step.started_at), v_now);
        run_id := v_step.run_id;
        node := v_step.node;
        action := v_step.action;
        attempt := v_step.attempt;
        max_attempts := v_step.max_attempts;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Claims up to p_limit ready steps of the actions a worker serves, highest priority
-- first, then oldest available_at, each action once however often p_actions names it,
-- with FOR UPDATE SKIP LOCKED: two claims never get the same step. Each becomes
-- running: attempt + 1, a new random lease token, deadline = now + timeout, lease =
-- min(p_lease, timeout), unsafe = whether the worker marks its action unsafe.
-- A ready step whose last lease expired with no outcome (effect_uncertain) is not
-- handed to a worker that marks its action unsafe: _block_uncertain blocks its run,
-- and it is returned first with blocked = true (and no lease). A worker that does not
-- mark it unsafe claims it like any step, with effect_uncertain = true in the reply.
-- Flow control (docs/flow-control.md): an action the worker declares rate limited
-- (p_rate_actions, with p_rate_counts claims per p_rate_periods) gets at most the room
-- _rate_room leaves in its window (its cyclone.action_rates row stays locked until
-- commit, and the claims made are added to it before the claim's update); a step with a
-- concurrency key is taken only while fewer than its limit run with that key: the walk
-- passes over keys already full (listed once, from steps_key_running_idx, as the
-- pick sees them), and _keys_room, under the keys' locks, gives the room of each key
-- picked; its steps are admitted in claim order. Steps and actions without them pay
-- for none of this. A claim may so return fewer steps than it could have.
-- Each row carries the run's input, the completed upstream outputs, how long the step
-- waited (waited_s) and, for a step allowed to run after a failure, its failed or
-- skipped upstream nodes with their last errors (upstream_failures), and the node's
-- journal of step calls in seq order (NULL when it has none).
-- A worker marked unhealthy (cyclone.worker_health: a lease of it lapsed) gets nothing:
-- the pick reads the mark in its own snapshot, so a sweep that made steps available and
-- marked their worker (one commit) is seen whole or not at all; a claim for that worker
-- racing the sweep cannot take the steps the sweep freed.
-- Builds (32_builds.sql): a worker of build p_build takes a node pinned to another build
-- only when the node has no journal, or the build is in p_build's compatibility set;
-- a worker without a build (p_build NULL) takes pinned nodes only when they have no
-- journal (_build_admits). The claim pins the node to p_build, unless it has a journal
-- and a pin already (a compatible build's worker keeps it on the build that started it).
-- A retired build's workers get nothing. With no builds declared, the rule costs the
-- walk one NULL test per row and the claim no statement.
-- Two statements for plain steps: the pick (the walk, its locks, and what the rows
-- need beyond the plain case), then one update of the rows picked, by their ctids,
-- that reads each run by key and returns the rows; so no plan scans steps. A key, a
-- sleep that ends or a rate limit adds a statement of its own, only when there is one
-- (docs/performance.md, "The engine's SQL"). A generic plan is forced
-- (the plan is the same walk of the ready index for every argument, and replanning
-- cost ~0.45 ms of a 1.5 ms claim), and no hash or merge join: each join is a lookup
-- by key or ctid, whatever the statistics.
-- The claim commits durably, as every transition does (synchronous_commit is left as
-- the server has it): a claim's attempt is handed to its worker only once it survives a
-- crash of Postgres, so that no attempt number of a step is handed out twice, and the
-- logs and errors kept under an attempt are one execution's
-- (tests/test_claim_durability.py). RPC: Claim.
CREATE FUNCTION cyclone.step_claim(
    p_worker text, p_actions text[], p_unsafe text[], p_limit integer, p_lease interval,
    p_rate_actions text[] DEFAULT '{}', p_rate_counts integer[] DEFAULT '{}',
    p_rate_periods interval[] DEFAULT '{}', p_build text DEFAULT NULL)
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb, run_deadline timestamptz, traceparent text)
LANGUAGE plpgsql
-- The plan is the same walk of the ready index for every argument, each join a lookup
-- by key or ctid (see above).
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    -- The rate-limited actions, and the room left in the window of each.
    v_rated text[] := '{}';
    v_rooms integer[] := '{}';
    -- The rows picked (then those admitted), by ctid; whether any has a concurrency key
    -- or ends a sleep; the steps (run_id || node) whose last lease expired unreported.
    v_rows      tid[];
    v_keyed     boolean;
    v_slept     boolean;
    v_uncertain text[];
    -- Whether every row picked is a first claim of a node with no upstream: then none
    -- has upstream outputs, upstream failures or a journal to hand out.
    v_plain     boolean;
    -- The builds whose pinned nodes this worker may take (_build_set).
    v_builds    text[] := '{}';
BEGIN
    -- A worker whose lease lapsed is handed nothing until it shows it is alive (checked
    -- here to block no run for it, and again by the pick, in the pick's snapshot).
    IF EXISTS (SELECT 1 FROM cyclone.worker_health h WHERE h.worker_id = p_worker) THEN
        RETURN;
    END IF;
    IF p_build IS NOT NULL THEN
        v_builds := cyclone._build_set(p_build);
        IF v_builds IS NULL THEN
            RETURN;  -- a retired build's workers take nothing
        END IF;
    END IF;

    IF cardinality(p_unsafe) > 0 THEN
        RETURN QUERY SELECT b.run_id, b.node, b.action, b.workflow, b.attempt, b.max_attempts,
                            NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::uuid,
                            NULL::timestamptz, NULL::timestamptz, NULL::jsonb, true, true,
                            NULL::float8, NULL::jsonb, NULL::jsonb, NULL::timestamptz,
                            NULL::text
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

    -- The pick: the ready rows, locked, in claim order (the walk of steps_ready_idx).
    -- What the claim needs beyond the plain case is found here: a concurrency key, a
    -- sleep that ends, an uncertain effect; each has a statement of its own below, run
    -- only when a picked row needs it, so a claim of plain steps runs two statements.
    SELECT coalesce(array_agg(c.row_id), '{}'), coalesce(bool_or(c.keyed), false),
           coalesce(bool_or(c.slept), false),
           coalesce(array_agg(c.uncertain) FILTER (WHERE c.uncertain IS NOT NULL), '{}'),
           coalesce(bool_and(c.plain), true)
      INTO v_rows, v_keyed, v_slept, v_uncertain, v_plain
      FROM (SELECT x.action,
                   least(p_limit, coalesce(v_rooms[array_position(v_rated, x.action)],
                                           p_limit)) AS room
              FROM (SELECT DISTINCT x FROM unnest(p_actions) x) AS x(action)) AS a
     CROSS JOIN LATERAL (
           SELECT s.ctid AS row_id, s.concurrency_key IS NOT NULL AS keyed,
                  s.waiting_for IS NOT DISTINCT FROM 'sleep' AS slept,
                  -- A run_id's text has a fixed length: run_id || node names a step.
                  CASE WHEN s.effect_uncertain THEN s.run_id::text || s.node END
                      AS uncertain,
                  s.attempt = 0 AND cardinality(s.depends_on) = 0 AS plain
             FROM cyclone.steps s
            WHERE s.status = 'available' AND s.action = a.action
              AND s.available_at <= v_now
              AND NOT (s.effect_uncertain AND s.action = ANY (p_unsafe))
              AND cyclone._build_admits(s.build_id, v_builds, EXISTS (
                      SELECT 1 FROM cyclone.step_calls j
                       WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0))
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
     -- Evaluated once, in this statement's snapshot.
     WHERE NOT EXISTS (SELECT 1 FROM cyclone.worker_health h WHERE h.worker_id = p_worker);
    IF cardinality(v_rows) = 0 THEN
        RETURN;
    END IF;
    IF cardinality(v_rows) > p_limit THEN
        -- Several actions gave more rows than the claim takes: the first p_limit of
        -- them in claim order. The rows past it stay locked until commit, unclaimed
        -- (the flags above may then speak of a row left out: each statement below
        -- reads the rows kept). One action never gives more than p_limit.
        v_rows := ARRAY(SELECT s.ctid FROM cyclone.steps s WHERE s.ctid = ANY (v_rows)
                         ORDER BY s.priority DESC, s.available_at LIMIT p_limit);
    END IF;

    IF v_keyed THEN
        -- Of the keyed rows picked, those each key has room for (_keys_room counts it
        -- under the keys' locks), in claim order; the others stay locked, unclaimed.
        -- The picked rows are read again by their ctids: this claim holds their locks.
        v_rows := ARRAY(
            WITH picked AS (
                SELECT s.ctid AS row_id, s.priority, s.available_at, s.concurrency_key,
                       s.concurrency_limit
                  FROM cyclone.steps s WHERE s.ctid = ANY (v_rows)
            ), keyed AS MATERIALIZED (
                SELECT r.concurrency_key, r.room
                  FROM (SELECT array_agg(k.concurrency_key) AS keys, array_agg(k.lim) AS limits
                          FROM (SELECT p.concurrency_key, min(p.concurrency_limit) AS lim
                                  FROM picked p WHERE p.concurrency_key IS NOT NULL
                                 GROUP BY p.concurrency_key) k) g
                 CROSS JOIN LATERAL cyclone._keys_room(g.keys, g.limits) r
            )
            SELECT p.row_id FROM picked p WHERE p.concurrency_key IS NULL
            UNION ALL
            SELECT p.row_id
              FROM (SELECT p.*, row_number() OVER (PARTITION BY p.concurrency_key
                                                   ORDER BY p.priority DESC, p.available_at) AS n
                      FROM picked p WHERE p.concurrency_key IS NOT NULL) p
              JOIN keyed k ON k.concurrency_key = p.concurrency_key
             WHERE p.n <= k.room);
    END IF;

    IF v_slept THEN
        -- A sleep is over once its node is claimed at or after the wake time: its
        -- journal entry succeeds here, as step_wait would record it when the body's
        -- replay reached the sleep, so the replay needs no Wait to go past it. Before
        -- the claim's update, which then hands out the journal as it is now.
        UPDATE cyclone.step_calls j
           SET status = 'succeeded', output = 'null', finished_at = v_now,
               attempt = s.attempt + 1
          FROM cyclone.steps s
         WHERE s.ctid = ANY (v_rows) AND s.waiting_for = 'sleep'
           AND j.run_id = s.run_id AND j.node = s.node
           AND j.status = 'waiting' AND j.function = 'cyclone.sleep'
           AND j.wake_at <= v_now;
    END IF;

    IF cardinality(p_rate_actions) > 0 THEN
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
                  JOIN (SELECT s.action, count(*)::integer AS n FROM cyclone.steps s
                         WHERE s.ctid = ANY (v_rows) GROUP BY s.action) c
                    ON c.action = r.action) r
         WHERE t.action = r.action;
    END IF;

    IF v_plain THEN
        -- The same update, with none of the lookups of upstream steps and journal.
        RETURN QUERY
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
                   -- A node claimed at its wake time has slept: see v_slept above.
                   waiting_for = CASE WHEN s.waiting_for = 'sleep' THEN NULL
                                      ELSE s.waiting_for END,
                   -- A first claim: no journal, no pin yet.
                   build_id = p_build
              FROM cyclone.runs r
             WHERE s.ctid = ANY (v_rows) AND r.run_id = s.run_id
            RETURNING s.run_id, s.node, s.action, r.workflow, s.attempt, s.max_attempts, s.input,
                      r.input, NULL::jsonb, s.lease_token, s.lease_expires_at, s.deadline_at,
                      s.progress,
                      cardinality(v_uncertain) > 0 AND s.run_id::text || s.node = ANY (v_uncertain),
                      false, date_part('epoch', v_now - s.available_at), NULL::jsonb,
                      NULL::jsonb, r.deadline, r.traceparent;
        RETURN;
    END IF;

    -- The upstream outputs are read after the update, joined to its rows: a claim's
    -- steps that share their upstream (the leaves of one fan-out) share one lookup
    -- (the plan memoizes it by run_id and depends_on), where a subquery per row probed
    -- the same key once per step (docs/performance.md, "Wide fan-outs"). Each
    -- upstream node is one probe of the primary key by (run_id, node), OFFSET 0
    -- keeping it so: written as node = ANY (depends_on), PostgreSQL 15 and 16, with
    -- statistics of runs of one or two steps, put only run_id in the index condition
    -- and filtered the run's steps by the list, a read of every step of a fan-out's
    -- run for each leaf claimed.
    RETURN QUERY
        WITH claimed AS (
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
                   -- A node claimed at its wake time has slept: see v_slept above.
                   waiting_for = CASE WHEN s.waiting_for = 'sleep' THEN NULL
                                      ELSE s.waiting_for END,
                   -- The pin stays while the node has a journal; else this build's.
                   build_id = CASE WHEN s.build_id IS NOT NULL AND EXISTS (
                                        SELECT 1 FROM cyclone.step_calls j
                                         WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0)
                                   THEN s.build_id ELSE p_build END
             -- The rows picked locked, by their ctids alone: no status condition here,
             -- which would let the planner read them through steps_ready_idx instead,
             -- a walk of every ready row (statistics taken while few rows were ready,
             -- as before a fan-out is released, make it look cheaper than the TID
             -- scan).
              FROM cyclone.runs r
             WHERE s.ctid = ANY (v_rows) AND r.run_id = s.run_id
            RETURNING s.run_id, s.node, s.action, r.workflow, s.attempt, s.max_attempts,
               s.input, r.input AS run_input, r.deadline AS run_deadline, r.traceparent,
               s.depends_on, s.lease_token, s.lease_expires_at,
               s.deadline_at, s.progress,
               -- A run_id's text has a fixed length: run_id || node names one step.
               cardinality(v_uncertain) > 0 AND s.run_id::text || s.node = ANY (v_uncertain)
                   AS uncertain,
               -- date_part: a float8 at once (extract's numeric costs a conversion per
               -- row).
               date_part('epoch', v_now - s.available_at) AS waited_s,
               CASE WHEN s.deps_failed > 0 THEN (
                   SELECT jsonb_agg(jsonb_build_object(
                              'node', u.node, 'status', u.status,
                              'error', CASE WHEN u.status = 'discarded' THEN (
                                  SELECT jsonb_build_object(
                                             'attempt', e.attempt, 'kind', e.kind,
                                             'type', e.type, 'message', e.message,
                                             'details', e.details,
                                             'retryable', e.retryable, 'at', e.at)
                                    FROM cyclone.step_errors e
                                   WHERE e.run_id = u.run_id AND e.node = u.node
                                   ORDER BY e.at DESC, e.attempt DESC LIMIT 1) END)
                          ORDER BY u.position)
                     FROM cyclone.steps u
                    WHERE u.run_id = s.run_id AND u.node = ANY (s.depends_on)
                      AND u.status IN ('discarded', 'skipped')) END AS failures,
               -- One probe of the journal's key per claimed step that was claimed
               -- before (a sleep that ended at this claim was recorded above, before
               -- this statement). A first claim (attempt 1) has no journal: every entry
               -- is written under a lease (_step_held), so none before a first claim.
               CASE WHEN s.attempt > 1 THEN (
                   SELECT jsonb_agg(cyclone._step_call_json(j) ORDER BY j.seq)
                     FROM cyclone.step_calls j
                    WHERE j.run_id = s.run_id AND j.node = s.node) END AS journal
        )
        SELECT c.run_id, c.node, c.action, c.workflow, c.attempt, c.max_attempts, c.input,
               c.run_input, up.outputs, c.lease_token, c.lease_expires_at, c.deadline_at,
               c.progress, c.uncertain, false, c.waited_s, c.failures, c.journal,
               c.run_deadline, c.traceparent
          FROM claimed c
          -- A node with no upstream gets no row here: outputs NULL, as before.
          LEFT JOIN LATERAL (
                SELECT jsonb_object_agg(u.node, u.output) AS outputs
                  FROM unnest(c.depends_on) AS d(node)
                 CROSS JOIN LATERAL (
                       SELECT u.node, u.output FROM cyclone.steps u
                        WHERE u.run_id = c.run_id AND u.node = d.node
                          AND u.status = 'completed' OFFSET 0) u) up ON true;
END;
$$;

-- Extends a held lease to now + p_lease, never past the node's deadline, records the
-- heartbeat's time, and keeps the progress value when one is given. Returns the new
-- expiry, or cancelled = true when the run was cancelled under the lease. CY001 when
-- the lease is lost (expired, even if not swept yet), CY002 for an unknown step.
-- Changes no status. RPC: Heartbeat.
CREATE FUNCTION cyclone.step_heartbeat(
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
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
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
