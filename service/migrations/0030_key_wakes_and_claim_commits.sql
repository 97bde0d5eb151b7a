-- A step that frees a slot of its concurrency key wakes the claims of its action only
-- when the key was full (_key_wake), not at every completion of a keyed step. Each
-- wake-up makes the action's waiting claims, on every server, claim again (and a
-- worker's own completion transaction sends a NOTIFY, which makes notifying commits
-- take turns); in the flow benchmark nearly every CompleteMany batch sent
-- one that no claim needed, since its keys had room.

-- The action to wake when p_freed steps of action p_action with concurrency key p_key
-- (limit p_limit) have just left `running`: p_action when the key was full before
-- they left, so that a claim may have passed over the key and be waiting for a slot;
-- NULL when the key had room (no claim was kept from it). Called after the transition
-- that freed them (so their rows are no longer among the running ones): counts the
-- key's running steps, at most p_limit of them, through steps_key_running_idx. A
-- wake-up makes every waiting claim of the action, on every server, claim again;
-- completions of keyed steps send one only when a claim may need it. A claim that
-- filled the key after this count is not seen; a claim that then waits for the slot
-- looks again at the server's --claim-recheck. Called by the completion and failure
-- transitions (_step_complete, step_complete_many, _step_fail_unheld) for steps with
-- a key only, in a statement of their own (Citus allows no such function in an
-- UPDATE's RETURNING).
CREATE FUNCTION cyclone._key_wake(p_action text, p_key text, p_limit integer,
                                  p_freed integer)
RETURNS text
-- PL/pgSQL: Citus cannot plan a SQL function's statement with parameters.
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN CASE WHEN (SELECT count(*) FROM (
                          SELECT 1 FROM cyclone.steps s
                           WHERE s.concurrency_key = p_key AND s.status = 'running'
                           LIMIT p_limit) n) + p_freed >= p_limit
                THEN p_action END;
END;
$$;

-- The completion transition, as the server applies it: a held step (running, same
-- token, lease not expired) becomes completed with its output; its dependents are
-- counted (_settle), or, with none, the run is closed by the count (_run_close). A
-- repeat with the token whose success was recorded answers duplicate = true and
-- changes nothing; any other mismatch raises CY001 (or CY002). RPC: Complete with an
-- output; also called by step_complete and step_complete_many.
CREATE OR REPLACE FUNCTION cyclone._step_complete(p_run_id uuid, p_node text, p_lease_token uuid,
                                       p_output jsonb)
RETURNS cyclone.completion
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now        timestamptz := cyclone.now();
    v_status     text := cyclone._run_lock(p_run_id);
    v_dependents text[];
    v_action     text;
    v_key        text;
    v_limit      integer;
    v_step       record;
BEGIN
    UPDATE cyclone.steps s
       SET status = 'completed', output = coalesce(p_output, 'null'::jsonb),
           finished_at = v_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
    RETURNING s.dependents, s.action, s.concurrency_key, s.concurrency_limit
         INTO v_dependents, v_action, v_key, v_limit;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        IF v_step.status = 'completed' AND v_step.lease_token = p_lease_token THEN
            RETURN ROW('completed', v_status, true, NULL)::cyclone.completion;
        END IF;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                    v_step.lease_token, v_step.attempt);
    END IF;
    IF cardinality(v_dependents) = 0 THEN
        v_status := cyclone._run_close(p_run_id, 1, v_now);
    ELSE
        v_status := cyclone._settle(p_run_id, ARRAY[p_node], '{}', 1);
    END IF;
    IF v_key IS NOT NULL AND cyclone._key_wake(v_action, v_key, v_limit, 1) IS NOT NULL THEN
        -- A slot of the step's full concurrency key is free: wake its action's claims.
        PERFORM cyclone._notify_ready(ARRAY[v_action]);
    END IF;
    RETURN ROW('completed', v_status, false, NULL)::cyclone.completion;
END;
$$;

-- CompleteMany: applies a batch of outcomes in one transaction. p_items is a JSON
-- array of {i, run_id, node, lease_token, output} or {..., failure: {type, message,
-- details, retryable, retry_after_s, uncertain}}. Locks every run of the batch in
-- run_id order (so two batches cannot deadlock); applies every success whose lease
-- holds in one statement, closes runs whose completed steps have no dependents by
-- count (_runs_close) and settles the others once per run (_settle); then takes the
-- rest one at a time in (run_id, node) order, each in its own subtransaction so that
-- a refusal (CY001, CY002, CY003) stands alone and is returned in its row: failures
-- through step_fail or step_abandon, and successes the first pass did not apply
-- through _step_complete (a repeat answers duplicate). RPC: CompleteMany.
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
    -- repeated completion, an unknown step), which _step_complete then explains.
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

-- Records a failed attempt of a held step (running, same token, lease not expired). A
-- retryable failure with attempts left (attempt - resumes < max_attempts: a claim that
-- resumed the node after a wait uses up no attempt) makes the step
-- available again after p_retry_after, or else after the node's exponential backoff
-- less a random jitter of up to half (_backoff); otherwise the step is discarded and
-- its dependents judged (_settle). The error joins the step's history (kind handler).
-- CY001 when the lease is lost. Does not look at the run's status: step_fail does.
-- Called only by step_fail.
CREATE OR REPLACE FUNCTION cyclone._step_fail_unheld(
    p_run_id uuid, p_node text, p_lease_token uuid, p_type text, p_message text,
    p_details text, p_retryable boolean, p_retry_after interval)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
    v_jitter float8 := random();
BEGIN
    UPDATE cyclone.steps s
       SET status = CASE WHEN p_retryable AND s.attempt - s.resumes < s.max_attempts
                         THEN 'available' ELSE 'discarded' END,
           available_at = CASE WHEN p_retryable AND s.attempt - s.resumes < s.max_attempts
                               THEN cyclone._later(v_now, coalesce(
                                        p_retry_after,
                                        cyclone._backoff(s.initial_backoff, s.max_backoff,
                                                         s.backoff_multiplier,
                                                         s.attempt - s.resumes, v_jitter)))
                          END,
           finished_at = CASE WHEN p_retryable AND s.attempt - s.resumes < s.max_attempts
                              THEN NULL ELSE v_now END,
           lease_expires_at = NULL, waiting_for = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
    RETURNING s.status, s.attempt, s.action, s.available_at,
              s.concurrency_key, s.concurrency_limit INTO v_step;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                v_step.lease_token, v_step.attempt);
    END IF;
    INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, details,
                                     retryable, at)
    VALUES (p_run_id, p_node, v_step.attempt, 'handler', coalesce(p_type, ''),
            coalesce(p_message, ''), coalesce(p_details, ''), v_step.status = 'available',
            v_now);
    IF v_step.status = 'discarded' THEN
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], '{}', 1);
    END IF;
    -- A retry is ready (now or later); a discarded step frees a slot of its full
    -- concurrency key: either way the claims of its action look again.
    IF v_step.status = 'available'
       OR v_step.concurrency_key IS NOT NULL
          AND cyclone._key_wake(v_step.action, v_step.concurrency_key,
                                v_step.concurrency_limit, 1) IS NOT NULL THEN
        PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
    END IF;
    RETURN ROW(v_step.status, (SELECT r.status FROM cyclone.runs r WHERE r.run_id = p_run_id),
               false, v_step.available_at)::cyclone.completion;
END;
$$;

-- A claim by a worker that marks no action unsafe to repeat commits without waiting for
-- its WAL flush (performance): half of a claim's time went to the flush.
-- Losing it in a crash of Postgres loses nothing and doubles nothing
-- (tests/test_claim_durability.py; docs/exactly-once.md, the crash matrix).

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
-- room of each key picked (0 for a key another claim is counting, when this claim
-- also took steps without a key); its steps are admitted in claim order. Steps and
-- actions without them pay for none of this. A claim may so return fewer steps than
-- it could have.
-- Each row carries the run's input, the completed upstream outputs, how long the step
-- waited (waited_s) and, for a step allowed to run after a failure, its failed or
-- skipped upstream nodes with their last errors (upstream_failures), and the node's
-- journal of step calls in seq order (NULL when it has none).
-- The claimed rows are updated by the ctids locked in the same statement and each
-- run read by key, so no plan scans steps; a generic plan is forced (the plan is the
-- same walk of the ready index for every argument, and replanning cost ~0.45 ms of a
-- 1.5 ms claim). RPC: Claim.
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
