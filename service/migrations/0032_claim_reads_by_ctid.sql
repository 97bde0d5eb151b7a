-- step_claim reads the rows it picked by their ctids alone.
--
-- The claimed rows were updated WHERE ctid = ANY (...) AND status = 'available'. The
-- status condition let the planner read them through steps_ready_idx instead: a walk
-- of every ready row, chosen whenever the statistics said few rows were ready (a
-- fan-out just released, a database analyzed while idle) and then kept in the cached
-- generic plan. In the fan bench each claim read 7,500 index entries for 64 steps
-- (step_claim 80 µs per step instead of 33).

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
           -- One probe of the journal's key per claimed step (a sleep that ended at
           -- this claim as slept left it: the statement still sees the old version).
           (SELECT jsonb_agg(cyclone._step_call_json(
                       CASE WHEN w.step_id IS NULL THEN j ELSE w::cyclone.step_calls END)
                       ORDER BY j.seq)
              FROM cyclone.step_calls j
              LEFT JOIN slept w ON p.slept AND w.run_id = j.run_id AND w.node = j.node
                               AND w.step_id = j.step_id
             WHERE j.run_id = c.run_id AND j.node = c.node)
      FROM claimed c
      JOIN admitted p ON p.run_id = c.run_id AND p.node = c.node
     -- OFFSET 0 keeps the lookup a subquery run once per claimed step, by key.
     CROSS JOIN LATERAL (SELECT r.workflow, r.input FROM cyclone.runs r
                          WHERE r.run_id = c.run_id OFFSET 0) r;
END;
$$;
