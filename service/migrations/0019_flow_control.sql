-- Flow control: start times, priorities, concurrency keys and rate limits,
-- all enforced by the claim.
--   runs.priority, runs.start_at           Submit's start_at and priority
--   steps.priority, concurrency_key/limit  per node, set at submit (run_submit)
--   steps_ready_idx                        (action, priority DESC, available_at)
--   steps_key_running_idx                  running steps by concurrency key
--   action_rates, _rate_room, _rate_next   the windows of rate-limited actions
--   _keys_room                             the turn and room of concurrency keys
--   step_claim                             priority order, keys, rates
--   step_next_due                          when a waiting claim looks again
--   run_submit                             start time, priorities, keys

ALTER TABLE cyclone.runs ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE cyclone.runs ADD COLUMN start_at timestamptz;
ALTER TABLE cyclone.steps ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE cyclone.steps ADD COLUMN concurrency_key text;
ALTER TABLE cyclone.steps ADD COLUMN concurrency_limit integer;

DROP INDEX cyclone.steps_ready_idx;
CREATE INDEX steps_ready_idx ON cyclone.steps (action, priority DESC, available_at)
    WHERE status = 'available';
CREATE INDEX steps_key_running_idx ON cyclone.steps (concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- The recent claims of each rate-limited action, in buckets: bucket i holds counts[i]
-- claims made between firsts[i] and lasts[i]. A bucket counts against the limit while
-- its last claim is inside the window (lasts[i] > now - period), so the count is never
-- less than the claims in the window. A bucket spans at most a sixteenth of the
-- period, so at most that share of the limit is lost to the rounding. Keyed by action
-- (not by run): one row per action that a worker declared a rate limit for; step_claim
-- locks it (_rate_room) and updates it (_rate_next) in the claim's transaction.
CREATE TABLE cyclone.action_rates (
    action     text          PRIMARY KEY,
    firsts     timestamptz[] NOT NULL DEFAULT '{}',
    lasts      timestamptz[] NOT NULL DEFAULT '{}',
    counts     integer[]     NOT NULL DEFAULT '{}',
    -- When the window had no room left after the last claim: when room opens again
    -- (step_next_due); NULL while there is room.
    reopens_at timestamptz,
    updated_at timestamptz   NOT NULL,
    CONSTRAINT action_rates_buckets_aligned CHECK (
        cardinality(firsts) = cardinality(lasts) AND cardinality(lasts) = cardinality(counts))
);

-- Locks p_action's row of action_rates (made on first use) until the claim's commit and
-- returns how many more claims its window of p_period allows (0 or more): p_count less
-- the claims of every bucket whose last claim is later than p_now - p_period (later
-- than p_now too: a claim that waited for the lock counts those before it). VOLATILE,
-- so its count reads the row as the lock holder before it left it. Called by
-- step_claim, once per rate-limited action, in action order.
CREATE FUNCTION cyclone._rate_room(p_action text, p_count integer, p_period interval,
                                   p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_rate record;
BEGIN
    INSERT INTO cyclone.action_rates (action, updated_at) VALUES (p_action, p_now)
    ON CONFLICT (action) DO NOTHING;
    SELECT t.lasts, t.counts INTO v_rate
      FROM cyclone.action_rates t WHERE t.action = p_action FOR UPDATE;
    RETURN greatest(p_count - (SELECT coalesce(sum(b.n), 0)
                                 FROM unnest(v_rate.lasts, v_rate.counts) AS b(last, n)
                                WHERE b.last > p_now - p_period), 0);
END;
$$;

-- The buckets of an action_rates row after p_n claims at p_now: buckets out of the
-- window dropped, the claims added to the newest bucket while it spans less than a
-- sixteenth of the period (else to a new one), and when the window is full, the time
-- it opens again (when enough of its oldest buckets have left it). Called by
-- step_claim's update of action_rates.
CREATE FUNCTION cyclone._rate_next(
    p_firsts timestamptz[], p_lasts timestamptz[], p_counts integer[], p_count integer,
    p_period interval, p_now timestamptz, p_n integer,
    OUT firsts timestamptz[], OUT lasts timestamptz[], OUT counts integer[],
    OUT reopens_at timestamptz)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_k    integer;
    v_used bigint;
BEGIN
    SELECT coalesce(array_agg(b.first ORDER BY b.i), '{}'),
           coalesce(array_agg(b.last ORDER BY b.i), '{}'),
           coalesce(array_agg(b.n ORDER BY b.i), '{}')
      INTO firsts, lasts, counts
      FROM unnest(p_firsts, p_lasts, p_counts) WITH ORDINALITY AS b(first, last, n, i)
     WHERE b.last > p_now - p_period;
    v_k := cardinality(firsts);
    IF p_n > 0 THEN
        IF v_k > 0 AND p_now >= firsts[v_k] AND p_now < firsts[v_k] + p_period / 16 THEN
            lasts[v_k] := greatest(lasts[v_k], p_now);
            counts[v_k] := counts[v_k] + p_n;
        ELSE
            firsts := firsts || p_now;
            lasts := lasts || p_now;
            counts := counts || p_n;
        END IF;
    END IF;
    -- Full: room opens when the oldest buckets holding (used - count + 1) claims left.
    SELECT min(b.last) + p_period INTO reopens_at
      FROM (SELECT u.last, sum(u.n) OVER (ORDER BY u.last, u.i) AS gone,
                   sum(u.n) OVER () AS used
              FROM unnest(lasts, counts) WITH ORDINALITY AS u(last, n, i)) b
     WHERE b.used >= p_count AND b.gone > b.used - p_count;
END;
$$;

-- Takes the locks of the concurrency keys p_keys until the claim's commit, in lock
-- order (so two claims never wait on each other), then returns how many more steps
-- of each key may start: its limit (p_limits, aligned) less its running steps, 0 or
-- more. Claims of one key so take turns, and each counts the running steps as the
-- previous one left them: VOLATILE, so the count is a new statement that reads the
-- rows committed when the locks were granted, through steps_key_running_idx, at most
-- the limit of them per key. A key's lock is the two-key advisory lock (1667,
-- hashtext(key)): keys whose hashes collide only share turns. Called by step_claim,
-- once per claim that picked keyed steps.
CREATE FUNCTION cyclone._keys_room(p_keys text[], p_limits integer[])
RETURNS TABLE (concurrency_key text, room integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1667, l.h)
       FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(p_keys) k ORDER BY 1) l;
    RETURN QUERY
    SELECT k.key, greatest(k.lim - (SELECT count(*) FROM (
               SELECT 1 FROM cyclone.steps s
                WHERE s.concurrency_key = k.key AND s.status = 'running'
                LIMIT k.lim) n), 0)::integer
      FROM unnest(p_keys, p_limits) AS k(key, lim);
END;
$$;

-- Seconds until a claim of these actions may find work (negative: now; NULL: none
-- known). For each action, each priority present among its ready rows is visited
-- once, through steps_ready_idx (a loose index scan), and gives the earliest later
-- available_at of that priority. A ready row whose time has come though the claim
-- just took nothing is held back by its concurrency key or its action's rate limit:
-- the rate's row says when its window opens (reopens_at); a key has no such time, so
-- the claim looks again in 0.2 s. Called by a waiting Claim (the named query
-- step_next_due) each time it finds nothing.
CREATE FUNCTION cyclone.step_next_due(p_actions text[])
RETURNS float8
-- PL/pgSQL keeps a generic plan of the statement (the same index probes for every
-- argument); planning it took four times as long as running it.
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (
    WITH RECURSIVE clock(now) AS (SELECT cyclone.now()),
    levels(action, priority) AS (
        SELECT a.action, (SELECT s.priority FROM cyclone.steps s
                           WHERE s.status = 'available' AND s.action = a.action
                           ORDER BY s.priority DESC LIMIT 1)
          FROM (SELECT DISTINCT x FROM unnest(p_actions) x) AS a(action)
        UNION ALL
        SELECT l.action, (SELECT s.priority FROM cyclone.steps s
                           WHERE s.status = 'available' AND s.action = l.action
                             AND s.priority < l.priority
                           ORDER BY s.priority DESC LIMIT 1)
          FROM levels l
         WHERE l.priority IS NOT NULL
    )
    SELECT extract(epoch FROM min(d.due) - min(c.now))::float8
      FROM clock c
     CROSS JOIN levels l
     CROSS JOIN LATERAL (
           SELECT (SELECT s.available_at FROM cyclone.steps s
                    WHERE s.status = 'available' AND s.action = l.action
                      AND s.priority = l.priority
                    ORDER BY s.available_at LIMIT 1) AS first_at,
                  (SELECT s.available_at FROM cyclone.steps s
                    WHERE s.status = 'available' AND s.action = l.action
                      AND s.priority = l.priority AND s.available_at > c.now
                    ORDER BY s.available_at LIMIT 1) AS next_at) f
     CROSS JOIN LATERAL (
           SELECT least(f.next_at,
                        CASE WHEN f.first_at <= c.now THEN coalesce(
                            (SELECT t.reopens_at FROM cyclone.action_rates t
                              WHERE t.action = l.action AND t.reopens_at > c.now),
                            c.now + interval '0.2 s') END) AS due) d
     WHERE l.priority IS NOT NULL);
END;
$$;

DROP FUNCTION cyclone.run_submit(uuid, text, text, jsonb, jsonb);

-- Creates a run and all its steps in one transaction; root steps become available
-- (not before p_start_at when it is later than now), the others pending with
-- deps_open = their number of upstream nodes. With a submit key, at most one run
-- exists per (workflow, key), also under concurrent calls (the second waits on the
-- first's key row): a repeated call returns that run with created = false. p_nodes is
-- a JSON array of node objects in topological order, validated by the server
-- (service/store.py), each with its priority (the node's, else p_priority) and its
-- evaluated concurrency key and limit, if any. RPCs: Submit, SubmitOnce.
CREATE FUNCTION cyclone.run_submit(
    p_run_id uuid, p_workflow text, p_submit_key text, p_input jsonb, p_nodes jsonb,
    p_start_at timestamptz DEFAULT NULL, p_priority integer DEFAULT 0,
    OUT run_id uuid, OUT created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    v_count integer := jsonb_array_length(p_nodes);
    v_ready timestamptz := greatest(v_now, coalesce(p_start_at, v_now));
BEGIN
    IF p_submit_key IS NOT NULL THEN
        -- A concurrent SubmitOnce with the same key waits here for the first to end.
        INSERT INTO cyclone.submit_keys (workflow, submit_key, run_id, created_at)
        VALUES (p_workflow, p_submit_key, p_run_id, v_now)
        ON CONFLICT (workflow, submit_key) DO NOTHING;
        IF NOT FOUND THEN
            SELECT k.run_id INTO run_id FROM cyclone.submit_keys k
             WHERE k.workflow = p_workflow AND k.submit_key = p_submit_key;
            created := false;
            RETURN;
        END IF;
    END IF;

    INSERT INTO cyclone.runs (run_id, workflow, submit_key, status, input, steps_total,
                              steps_open, created_at, updated_at, priority, start_at)
    VALUES (p_run_id, p_workflow, p_submit_key, 'running', p_input, v_count, v_count,
            v_now, v_now, coalesce(p_priority, 0), p_start_at);

    INSERT INTO cyclone.steps (run_id, node, position, action, status, trigger_rule, depends_on,
                               dependents, deps_open, max_attempts, attempt_budget,
                               initial_backoff, max_backoff, backoff_multiplier, timeout,
                               input, available_at, priority, concurrency_key,
                               concurrency_limit)
    SELECT p_run_id, n.name, n.position, n.action,
           CASE WHEN cardinality(n.depends_on) = 0 THEN 'available' ELSE 'pending' END,
           n.trigger_rule, n.depends_on, n.dependents, cardinality(n.depends_on),
           n.max_attempts, n.max_attempts, make_interval(secs => n.initial_backoff_s),
           make_interval(secs => n.max_backoff_s), n.backoff_multiplier,
           make_interval(secs => n.timeout_s), n.input,
           CASE WHEN cardinality(n.depends_on) = 0 THEN v_ready END,
           coalesce(n.priority, p_priority, 0), n.concurrency_key, n.concurrency_limit
      FROM jsonb_to_recordset(p_nodes) AS n(
               name text, position integer, action text, depends_on text[], dependents text[],
               trigger_rule text, max_attempts integer, initial_backoff_s float8,
               max_backoff_s float8, backoff_multiplier float8, timeout_s float8, input jsonb,
               priority integer, concurrency_key text, concurrency_limit integer);

    -- Also for a run that starts later: a waiting claim that wakes for nothing sets
    -- its timer by the earliest available_at (step_next_due), now the start time.
    PERFORM cyclone._notify_ready(array_agg(e.node->>'action'))
       FROM jsonb_array_elements(p_nodes) e(node)
      WHERE jsonb_array_length(e.node->'depends_on') = 0;
    run_id := p_run_id;
    created := true;
END;
$$;

DROP FUNCTION cyclone.step_claim(text, text[], text[], integer, interval);

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
-- commit, and the claims made are added to it in the same statement); a step with a
-- concurrency key is taken only while fewer than its limit run with that key: the walk
-- passes over keys already full (listed once, from steps_key_running_idx, as the
-- statement's snapshot sees them), and _keys_room, under the keys' locks, gives the
-- room of each key picked; its steps are admitted in claim order. Steps and actions without them pay for
-- none of this. A claim may so return fewer steps than it could have.
-- Each row carries the run's input, the completed upstream outputs, how long the step
-- waited (waited_s) and, for a step allowed to run after a failure, its failed or
-- skipped upstream nodes with their last errors (upstream_failures), and the node's
-- journal of step calls in seq order (NULL when it has none).
-- The claimed rows are updated by the ctids locked in the same statement and each
-- run read by key, so no plan scans steps; a generic plan is forced (the plan is the
-- same walk of the ready index for every argument, and replanning cost ~0.45 ms of a
-- 1.5 ms claim). RPC: Claim.
CREATE FUNCTION cyclone.step_claim(
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

    RETURN QUERY
    WITH picked AS (
        SELECT c.row_id, c.run_id, c.node, c.effect_uncertain, c.available_at, c.priority,
               c.concurrency_key, c.concurrency_limit
          FROM (SELECT x.action,
                       least(p_limit, coalesce(v_rooms[array_position(v_rated, x.action)],
                                               p_limit)) AS room
                  FROM (SELECT DISTINCT x FROM unnest(p_actions) x) AS x(action)) AS a
         CROSS JOIN LATERAL (
               SELECT s.ctid AS row_id, s.run_id, s.node, s.available_at, s.effect_uncertain,
                      s.priority, s.concurrency_key, s.concurrency_limit
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
        SELECT p.row_id, p.run_id, p.node, p.effect_uncertain, p.available_at
          FROM picked p WHERE p.concurrency_key IS NULL
        UNION ALL
        SELECT p.row_id, p.run_id, p.node, p.effect_uncertain, p.available_at
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
               effect_uncertain = false
         WHERE s.ctid = ANY (ARRAY(SELECT p.row_id FROM admitted p))
           AND s.status = 'available'
        RETURNING s.run_id, s.node, s.action, s.attempt, s.max_attempts, s.input,
                  s.depends_on, s.deps_failed, s.lease_token, s.lease_expires_at,
                  s.deadline_at, s.progress
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
           -- One probe of the journal's key per claimed step.
           (SELECT jsonb_agg(cyclone._step_call_json(j) ORDER BY j.seq)
              FROM cyclone.step_calls j
             WHERE j.run_id = c.run_id AND j.node = c.node)
      FROM claimed c
      JOIN admitted p ON p.run_id = c.run_id AND p.node = c.node
     -- OFFSET 0 keeps the lookup a subquery run once per claimed step, by key.
     CROSS JOIN LATERAL (SELECT r.workflow, r.input FROM cyclone.runs r
                          WHERE r.run_id = c.run_id OFFSET 0) r;
END;
$$;
