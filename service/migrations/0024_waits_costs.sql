-- Two costs of the waits bench (performance), and a fresh attempt budget that
-- counted resumes (a fix).
--
-- Batched completions find each step by its key, whatever the size of the steps
-- table. With few rows, the planner hashed the whole table for
-- step_complete_many's join of the batch to steps: one sequential scan per batch,
-- reading every live and dead row (tests/test_plans.py, "small" statistics).
ALTER FUNCTION cyclone.step_complete_many(jsonb) SET enable_hashjoin = off;
ALTER FUNCTION cyclone.step_complete_many(jsonb) SET enable_mergejoin = off;

-- A sleep ends at the claim that resumes its node at or after the wake time:
-- step_claim records the journal entry succeeded and hands it out so, and the body's
-- replay goes past the sleep without a Wait (before: one more RPC and transaction per
-- sleep).
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
         WHERE s.ctid = ANY (ARRAY(SELECT p.row_id FROM admitted p))
           AND s.status = 'available'
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

-- Retry and Resolve give a node a fresh attempt budget: max_attempts = attempt -
-- resumes + attempt_budget. Written without "- resumes", every claim that had resumed
-- a wait (not an attempt: step_fail and the sweep compare attempt - resumes) became
-- one more attempt granted.
CREATE OR REPLACE FUNCTION cyclone.step_retry(p_run_id uuid, p_nodes text[], p_actor text,
                                              p_reason text)
RETURNS text[]
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_nodes  text[];
    v_bad    record;
    v_reset  text[];
    v_decide text[];
BEGIN
    IF v_status IN ('blocked', 'cancelled') THEN
        RAISE EXCEPTION 'run % is %: only a running or failed run can be retried',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    IF p_nodes IS NULL THEN
        v_nodes := ARRAY(SELECT s.node FROM cyclone.steps s
                          WHERE s.run_id = p_run_id AND s.status = 'discarded' ORDER BY s.node);
        IF cardinality(v_nodes) = 0 THEN
            RAISE EXCEPTION 'run % has no discarded node to retry', p_run_id
                USING ERRCODE = 'CY003';
        END IF;
    ELSE
        v_nodes := p_nodes;
        SELECT n.node, s.status INTO v_bad
          FROM unnest(p_nodes) n(node)
          LEFT JOIN cyclone.steps s ON s.run_id = p_run_id AND s.node = n.node
         WHERE s.status IS DISTINCT FROM 'discarded' LIMIT 1;
        IF FOUND AND v_bad.status IS NULL THEN
            RAISE EXCEPTION 'run % has no node %', p_run_id, left(v_bad.node, 200)
                USING ERRCODE = 'CY002';
        ELSIF FOUND THEN
            RAISE EXCEPTION 'node % is %, not discarded: only a discarded node can be retried',
                v_bad.node, v_bad.status USING ERRCODE = 'CY003';
        END IF;
    END IF;

    WITH RECURSIVE down(node) AS (
        SELECT unnest(v_nodes)
        UNION
        SELECT t.node
          FROM down d
          JOIN cyclone.steps s ON s.run_id = p_run_id AND s.node = d.node
          JOIN cyclone.steps t ON t.run_id = p_run_id AND t.node = ANY (s.dependents)
         WHERE t.status <> 'completed'
    )
    SELECT array_agg(node) INTO v_reset FROM down;

    INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
    SELECT p_run_id, s.node, s.attempt, 'reset', 'Reset',
           format('lease of worker %s revoked: an upstream node was retried', s.worker_id),
           true, v_now
      FROM cyclone.steps s
     WHERE s.run_id = p_run_id AND s.node = ANY (v_reset) AND s.status = 'running';

    -- Counts read the statuses before this statement: a reset upstream node counts as
    -- open, whatever it was.
    UPDATE cyclone.steps s
       SET status = 'pending', available_at = NULL, finished_at = NULL,
           lease_expires_at = NULL,
           effect_uncertain = s.effect_uncertain OR s.status = 'running',
           max_attempts = s.attempt - s.resumes + s.attempt_budget,
           deps_open = c.open, deps_failed = c.failed
      FROM (SELECT t.node,
                   count(u.node) FILTER (
                       WHERE u.node = ANY (v_reset)
                          OR u.status IN ('pending', 'available', 'running', 'uncertain'))
                       AS open,
                   count(u.node) FILTER (
                       WHERE NOT u.node = ANY (v_reset)
                         AND u.status IN ('discarded', 'skipped')) AS failed
              FROM cyclone.steps t
              LEFT JOIN cyclone.steps u ON u.run_id = t.run_id AND u.node = ANY (t.depends_on)
             WHERE t.run_id = p_run_id AND t.node = ANY (v_reset)
             GROUP BY t.node) c
     WHERE s.run_id = p_run_id AND s.node = c.node;

    UPDATE cyclone.runs r
       SET status = 'running', error = NULL, finished_at = NULL, updated_at = v_now,
           steps_open = (SELECT count(*) FROM cyclone.steps s
                          WHERE s.run_id = p_run_id
                            AND s.status IN ('pending', 'available', 'running', 'uncertain'))
     WHERE r.run_id = p_run_id;

    v_decide := ARRAY(SELECT s.node FROM cyclone.steps s
                       WHERE s.run_id = p_run_id AND s.node = ANY (v_reset) AND s.deps_open = 0);
    PERFORM cyclone._settle(p_run_id, '{}', v_decide, 0);
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, CASE WHEN p_nodes IS NULL THEN '' ELSE p_nodes[1] END,
            CASE WHEN p_nodes IS NULL THEN 'retry_all' ELSE 'retry' END, p_actor,
            coalesce(p_reason, ''),
            jsonb_build_object('nodes', to_jsonb(v_nodes),
                               'reset', to_jsonb(ARRAY(SELECT unnest(v_reset)
                                                       EXCEPT SELECT unnest(v_nodes)))),
            v_now);
    RETURN v_nodes;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone.step_resolve(p_run_id uuid, p_node text, p_choice text,
                                                p_value jsonb, p_actor text, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
    v_held   text[];
    v_error  jsonb;
BEGIN
    IF v_status <> 'blocked' THEN
        RAISE EXCEPTION 'run % is %, not blocked: only a blocked run can be resolved',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    SELECT r.error INTO v_error FROM cyclone.runs r WHERE r.run_id = p_run_id;
    IF v_error ? 'step_id' THEN
        RAISE EXCEPTION 'run % is blocked on step call % of node %: resolve it with step_id %',
            p_run_id, v_error->>'step_id', v_error->>'node', v_error->>'step_id'
            USING ERRCODE = 'CY003';
    END IF;
    SELECT s.status, s.attempt, s.action INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % has no node %', p_run_id, left(p_node, 200)
            USING ERRCODE = 'CY002';
    END IF;
    IF v_step.status <> 'uncertain' THEN
        RAISE EXCEPTION 'node % is %, not uncertain: only the uncertain step of a blocked run '
                        'can be resolved (here: %)', p_node, v_step.status,
            (SELECT string_agg(s.node, ', ') FROM cyclone.steps s
              WHERE s.run_id = p_run_id AND s.status = 'uncertain')
            USING ERRCODE = 'CY003';
    END IF;

    UPDATE cyclone.runs SET status = 'running', error = NULL, updated_at = v_now
     WHERE run_id = p_run_id;
    -- Release what was held while blocked.
    v_held := ARRAY(SELECT s.node FROM cyclone.steps s
                     WHERE s.run_id = p_run_id AND s.status = 'pending' AND s.deps_open = 0);
    CASE p_choice
    WHEN 'result' THEN
        UPDATE cyclone.steps s
           SET status = 'completed', output = coalesce(p_value, 'null'::jsonb),
               finished_at = v_now, effect_uncertain = false, lease_token = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], v_held, 1);
    WHEN 'error' THEN
        UPDATE cyclone.steps s
           SET status = 'discarded', finished_at = v_now, effect_uncertain = false,
               lease_token = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node;
        INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
        VALUES (p_run_id, p_node, v_step.attempt, 'resolved', 'EffectFailed',
                p_value #>> '{}', false, v_now);
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], v_held, 1);
    WHEN 'discard' THEN
        UPDATE cyclone.steps s
           SET status = 'available', available_at = v_now, effect_uncertain = false,
               lease_token = NULL, max_attempts = s.attempt - s.resumes + s.attempt_budget
         WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
        PERFORM cyclone._settle(p_run_id, '{}', v_held, 0);
    ELSE
        RAISE EXCEPTION 'unknown resolution %', left(p_choice, 50) USING ERRCODE = 'CY004';
    END CASE;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, p_node, 'resolve_' || p_choice, p_actor, coalesce(p_reason, ''),
            jsonb_build_object('attempt', v_step.attempt, 'value', p_value), v_now);
END;
$$;

CREATE OR REPLACE FUNCTION cyclone.step_call_resolve(
    p_run_id uuid, p_node text, p_step_id text, p_choice text, p_value jsonb, p_actor text,
    p_reason text)
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_error  jsonb;
    v_node   text;
    v_step   record;
    v_held   text[];
BEGIN
    IF p_choice IS NULL OR p_choice NOT IN ('result', 'error', 'discard') THEN
        RAISE EXCEPTION 'unknown resolution %', left(p_choice, 50) USING ERRCODE = 'CY004';
    END IF;
    IF v_status <> 'blocked' THEN
        RAISE EXCEPTION 'run % is %, not blocked: only a blocked run can be resolved',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    SELECT r.error INTO v_error FROM cyclone.runs r WHERE r.run_id = p_run_id;
    v_node := coalesce(nullif(p_node, ''), v_error->>'node');
    SELECT s.status, s.attempt, s.action INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = v_node FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % has no node %', p_run_id, left(v_node, 200)
            USING ERRCODE = 'CY002';
    END IF;
    IF NOT v_error ? 'step_id' THEN
        RAISE EXCEPTION 'run % is blocked on node % itself, not on a step call: resolve it '
                        'without step_id', p_run_id, v_error->>'node'
            USING ERRCODE = 'CY003';
    END IF;
    IF v_error->>'node' IS DISTINCT FROM v_node
       OR v_error->>'step_id' IS DISTINCT FROM p_step_id THEN
        RAISE EXCEPTION 'run % is blocked on step call % of node %, not on % of %',
            p_run_id, v_error->>'step_id', v_error->>'node', left(p_step_id, 200),
            left(v_node, 200)
            USING ERRCODE = 'CY003';
    END IF;

    CASE p_choice
    WHEN 'result' THEN
        UPDATE cyclone.step_calls c
           SET status = 'succeeded', output = coalesce(p_value, 'null'::jsonb),
               finished_at = v_now
         WHERE c.run_id = p_run_id AND c.node = v_node AND c.step_id = p_step_id
           AND c.status = 'started';
    WHEN 'error' THEN
        UPDATE cyclone.step_calls c
           SET status = 'failed', finished_at = v_now,
               error = jsonb_build_object('type', 'EffectFailed', 'message',
                                          coalesce(p_value #>> '{}', ''), 'details', '')
         WHERE c.run_id = p_run_id AND c.node = v_node AND c.step_id = p_step_id
           AND c.status = 'started';
    ELSE
        DELETE FROM cyclone.step_calls c
         WHERE c.run_id = p_run_id AND c.node = v_node AND c.step_id = p_step_id
           AND c.status = 'started';
    END CASE;

    UPDATE cyclone.runs SET status = 'running', error = NULL, updated_at = v_now
     WHERE run_id = p_run_id;
    -- Release what was held while blocked.
    v_held := ARRAY(SELECT s.node FROM cyclone.steps s
                     WHERE s.run_id = p_run_id AND s.status = 'pending' AND s.deps_open = 0);
    UPDATE cyclone.steps s
       SET status = 'available', available_at = v_now, effect_uncertain = false,
           lease_token = NULL, max_attempts = s.attempt - s.resumes + s.attempt_budget
     WHERE s.run_id = p_run_id AND s.node = v_node;
    PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
    PERFORM cyclone._settle(p_run_id, '{}', v_held, 0);
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, v_node, 'resolve_' || p_choice, p_actor, coalesce(p_reason, ''),
            jsonb_build_object('attempt', v_step.attempt, 'step_id', p_step_id,
                               'value', p_value),
            v_now);
    RETURN v_node;
END;
$$;
