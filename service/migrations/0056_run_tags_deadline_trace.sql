-- Runs carry their tags, their deadline and the submitting client's trace context,
-- each given to run_submit (NULL when absent).
ALTER TABLE cyclone.runs ADD COLUMN tags jsonb, ADD COLUMN deadline timestamptz,
    ADD COLUMN traceparent text;

DROP FUNCTION cyclone.run_submit(uuid, text, text, jsonb, jsonb, timestamptz, integer);

CREATE FUNCTION cyclone.run_submit(
    p_run_id uuid, p_workflow text, p_submit_key text, p_input jsonb, p_nodes jsonb,
    p_start_at timestamptz DEFAULT NULL, p_priority integer DEFAULT 0,
    p_tags jsonb DEFAULT NULL, p_deadline timestamptz DEFAULT NULL,
    p_traceparent text DEFAULT NULL,
    OUT run_id uuid, OUT created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    v_count integer := jsonb_array_length(p_nodes);
    v_ready timestamptz := greatest(v_now, coalesce(p_start_at, v_now));
    v_key   record;
BEGIN
    IF p_submit_key IS NOT NULL THEN
        p_run_id := cyclone.submit_key_id(p_workflow, p_submit_key);
        -- A concurrent SubmitOnce with the same key waits here for the first to end.
        INSERT INTO cyclone.submit_keys (key_id, workflow, submit_key, run_id, created_at)
        VALUES (p_run_id, p_workflow, p_submit_key, p_run_id, v_now)
        ON CONFLICT (key_id) DO NOTHING;
        IF NOT FOUND THEN
            SELECT k.run_id, k.workflow, k.submit_key INTO v_key FROM cyclone.submit_keys k
             WHERE k.key_id = p_run_id;
            -- Two keys with one SHA-256 prefix: refused rather than answered wrongly.
            IF v_key.workflow <> p_workflow OR v_key.submit_key <> p_submit_key THEN
                RAISE EXCEPTION 'submit key % of workflow % has the id of another key',
                    p_submit_key, p_workflow USING ERRCODE = 'CY004';
            END IF;
            run_id := v_key.run_id;
            created := false;
            RETURN;
        END IF;
    END IF;

    INSERT INTO cyclone.runs (run_id, workflow, submit_key, status, input, steps_total,
                              steps_open, created_at, updated_at, priority, start_at, tags,
                              deadline, traceparent)
    VALUES (p_run_id, p_workflow, p_submit_key, 'running', p_input, v_count, v_count,
            v_now, v_now, coalesce(p_priority, 0), p_start_at, p_tags, p_deadline,
            p_traceparent);

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

-- The claim hands each step its run's deadline and traceparent (ClaimedStep
-- run_deadline, traceparent): two more columns out of every claim function.
DROP FUNCTION cyclone.step_claim(text, text[], text[], integer, interval, text[], integer[],
                                 interval[], text);
DROP FUNCTION cyclone.step_claim_run(uuid, text[], text, text[], interval, text, text[]);
DROP FUNCTION cyclone.step_claim_shard(uuid, uuid[], text[], text, text[], interval, text,
                                       text[]);
DROP FUNCTION cyclone.step_claim_flow(uuid[], text[], text[], text[], integer[], text, text[],
                                      interval, integer, text[], integer[], interval[], text,
                                      text[]);

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
    v_now    timestamptz := cyclone.now();
    v_run    uuid;
    v_nodes  text[];
    -- The tables as this node holds them: on Citus the shards of p_run_id's group,
    -- which this call (delegated to their node) reads and writes as the plain tables
    -- they are, planned once per statement rather than twice.
    v_tables text[] := ARRAY['cyclone.steps', 'cyclone.step_calls', 'cyclone.step_errors',
                             'cyclone.runs', 'cyclone.worker_health'];
    v_shards text[];
BEGIN
    -- A worker whose lease lapsed is handed nothing (and again in the pick's snapshot).
    IF EXISTS (SELECT 1 FROM cyclone.worker_health h WHERE h.worker_id = p_worker) THEN
        RETURN;
    END IF;
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
    -- One statement for every run; $1 the runs, $2 their nodes (aligned), $3 a lease token
    -- for each, drawn here (Citus refuses a volatile function in an UPDATE of a
    -- distributed table), $4 the time, $5 the worker, $6 the lease, $7 the worker's build,
    -- $8 its set; %1$s steps, %2$s step_calls, %3$s step_errors, %4$s runs, %5$s
    -- worker_health (a reference table: its shard is on every node).
    RETURN QUERY EXECUTE format($q$
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
$q$, v_tables[1], v_tables[2], v_tables[3], v_tables[4], v_tables[5])
        USING p_runs, p_nodes, ARRAY(SELECT gen_random_uuid() FROM unnest(p_nodes)), v_now,
              p_worker, p_lease, p_build, p_builds;
END;
$$;

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
