-- The claim reads a worker's unhealthy mark in the same statement (and snapshot) as the
-- pick of ready steps. Read in a statement of its own before the pick, the mark of a
-- sweep that committed between the two was missed while the steps that sweep freed
-- were seen: a claim on behalf of a frozen worker's open Work stream could take back the
-- very step that had just been reclaimed from it.
CREATE OR REPLACE FUNCTION cyclone.step_claim(
    p_worker text, p_actions text[], p_unsafe text[], p_limit integer, p_lease interval,
    p_rate_actions text[] DEFAULT '{}', p_rate_counts integer[] DEFAULT '{}',
    p_rate_periods interval[] DEFAULT '{}', p_build text DEFAULT NULL)
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb)
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
                      NULL::jsonb;
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
               s.input, r.input AS run_input, s.depends_on, s.lease_token, s.lease_expires_at,
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
               c.progress, c.uncertain, false, c.waited_s, c.failures, c.journal
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
