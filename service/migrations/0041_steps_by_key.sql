-- Lookups of a run's steps by key on every version (issue 19, session 13;
-- docs/performance.md, "Wide fan-outs on PostgreSQL 15").
--
-- step_claim read each claimed step's upstream outputs, and _settle each list of a
-- run's steps (the finals of a wave, their dependents, the nodes to judge, skip and
-- release), with node = ANY (list). On PostgreSQL 15 and 16, with statistics gathered
-- while runs had one or two steps (a history of one-node runs), the generic plans put
-- only run_id in the primary key's index condition and filtered the run's steps by
-- the list: a fan-out of 10,000 leaves after 10,000 one-node runs drained at 410
-- steps/s, 4.5 ms of Postgres CPU per step, every claimed leaf and every count at the
-- join reading all 10,002 steps of the run. The claim now probes the key once per
-- upstream node; _settle finds its rows' ctids through _step_rows (one probe per name
-- before PostgreSQL 17, one scan of the key for the list from 17 on) and reads and
-- updates them by ctid.

CREATE FUNCTION cyclone._step_rows(p_run_id uuid, p_nodes text[]) RETURNS tid[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF current_setting('server_version_num')::integer >= 170000 THEN
        RETURN ARRAY(SELECT s.ctid FROM cyclone.steps s
                      WHERE s.run_id = p_run_id AND s.node = ANY (p_nodes));
    END IF;
    RETURN ARRAY(SELECT x.row_id
                   FROM unnest(p_nodes) AS n(node)
                  CROSS JOIN LATERAL (SELECT s.ctid AS row_id FROM cyclone.steps s
                                       WHERE s.run_id = p_run_id AND s.node = n.node
                                      OFFSET 0) x);
END;
$$;

CREATE OR REPLACE FUNCTION cyclone._settle(p_run_id uuid, p_final text[], p_decide text[], p_closed integer,
                                p_from integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := cyclone.now();
    v_wave     text[] := p_final;
    v_decide   text[] := p_decide;
    v_ready    text[] := '{}';
    v_runs     text[];
    v_closed   integer := p_closed;
    v_running  boolean;
    -- The actions of the steps made available, for _notify_ready.
    v_actions  text[] := '{}';
    -- The wave's dependents, and for each its count of finals and of failed finals:
    -- by name in v_counts, or, for a wave of one final, the same for every dependent
    -- (one, and whether that final failed) in v_one and v_one_failed.
    v_targets  text[];
    v_counts   jsonb;
    v_one      integer;
    v_one_failed integer;
    -- Dependents counted in one transaction, at most, for a wave of one final; and
    -- p_from, for the first wave only.
    c_chunk    constant integer := 1000;
    v_from     integer := p_from;
BEGIN
    v_running := (SELECT r.status = 'running' FROM cyclone.runs r WHERE r.run_id = p_run_id);
    LOOP
        IF cardinality(v_wave) > 0 THEN
            -- Count the whole wave at each pending dependent: the counts first, then
            -- the dependents updated by key, each looking its count up by name. One
            -- left with no open upstream is released here when its rule is met and the
            -- run is running; the others left with none are judged below.
            IF cardinality(v_wave) = 1 THEN
                -- One final (a root's completion, the wave of a single failure): each
                -- of its dependents counts it once, so no count is looked up by name.
                -- For a fan-out of 10,000 the lookups were a third of the release
                -- (docs/performance.md, "The release of a wide fan-out").
                SELECT f.dependents, 1, (f.status <> 'completed')::integer
                  INTO v_targets, v_one, v_one_failed
                  FROM cyclone.steps f WHERE f.run_id = p_run_id AND f.node = v_wave[1];
                IF v_from IS NOT NULL THEN
                    -- The next chunk of a release in progress; its row is the last
                    -- when no dependent is left after it.
                    IF v_from + c_chunk > cardinality(v_targets) THEN
                        DELETE FROM cyclone.releases x WHERE x.run_id = p_run_id;
                    ELSE
                        UPDATE cyclone.releases x SET next = v_from + c_chunk
                         WHERE x.run_id = p_run_id;
                    END IF;
                    v_targets := v_targets[v_from : v_from + c_chunk - 1];
                ELSIF cardinality(v_targets) > c_chunk
                      AND NOT EXISTS (SELECT 1 FROM cyclone.releases x
                                       WHERE x.run_id = p_run_id) THEN
                    -- A release in chunks: the first now, the others by release_continue,
                    -- which the servers run as soon as this commits (woken by the name
                    -- cyclone.release, which no action has).
                    INSERT INTO cyclone.releases (run_id, node, next, created_at)
                    VALUES (p_run_id, v_wave[1], c_chunk + 1, v_now);
                    v_targets := v_targets[1:c_chunk];
                    v_actions := v_actions || 'cyclone.release'::text;
                END IF;
            ELSE
                SELECT array_agg(fin.node),
                       jsonb_object_agg(fin.node, jsonb_build_array(fin.n, fin.failed)),
                       NULL, NULL
                  INTO v_targets, v_counts, v_one, v_one_failed
                  FROM (SELECT d.node, count(*)::integer AS n,
                               (count(*) FILTER (WHERE f.status <> 'completed'))::integer
                                   AS failed
                          FROM cyclone.steps f
                         CROSS JOIN LATERAL unnest(f.dependents) AS d(node)
                         WHERE f.ctid = ANY (cyclone._step_rows(p_run_id, v_wave))
                         GROUP BY d.node) fin;
            END IF;
            -- coalesce evaluates the lookup by name only when there is no v_one.
            WITH counted AS (
                UPDATE cyclone.steps s
                   SET deps_open = s.deps_open
                                   - coalesce(v_one, (v_counts->s.node->>0)::integer),
                       deps_failed = s.deps_failed
                                     + coalesce(v_one_failed, (v_counts->s.node->>1)::integer),
                       status = CASE
                           WHEN v_running
                                AND s.deps_open = coalesce(v_one,
                                                           (v_counts->s.node->>0)::integer)
                                AND cyclone._rule_met(s.trigger_rule, s.deps_failed
                                        + coalesce(v_one_failed,
                                                   (v_counts->s.node->>1)::integer))
                           THEN 'available' ELSE s.status END,
                       available_at = CASE
                           WHEN v_running
                                AND s.deps_open = coalesce(v_one,
                                                           (v_counts->s.node->>0)::integer)
                                AND cyclone._rule_met(s.trigger_rule, s.deps_failed
                                        + coalesce(v_one_failed,
                                                   (v_counts->s.node->>1)::integer))
                           THEN v_now ELSE s.available_at END
                 WHERE s.ctid = ANY (cyclone._step_rows(p_run_id, v_targets))
                   AND s.status = 'pending'
                RETURNING s.node, s.deps_open, s.status, s.action
            )
            SELECT v_decide || coalesce(array_agg(node) FILTER (WHERE status = 'pending'), '{}'),
                   v_actions || coalesce(array_agg(action) FILTER (WHERE status = 'available'),
                                         '{}')
              INTO v_decide, v_actions
              FROM counted WHERE deps_open = 0;
            v_from := NULL;
        END IF;
        EXIT WHEN cardinality(v_decide) = 0;

        -- Judge the pending steps whose upstream is all final.
        WITH judged AS (
            -- A node with no upstream always runs, whatever its rule, as at submit
            -- (it is judged here when released after Resolve or reset by Retry).
            SELECT ctid AS row_id, node, cardinality(depends_on) = 0
                         OR cyclone._rule_met(trigger_rule, deps_failed) AS runs
              FROM cyclone.steps
             WHERE ctid = ANY (cyclone._step_rows(p_run_id, v_decide))
               AND status = 'pending' AND deps_open = 0
        ), skipped AS (
            UPDATE cyclone.steps s SET status = 'skipped', finished_at = v_now
             WHERE s.ctid = ANY (ARRAY(SELECT j.row_id FROM judged j WHERE NOT j.runs))
               AND s.status = 'pending'
            RETURNING s.node
        )
        SELECT ARRAY(SELECT node FROM judged WHERE runs),
               ARRAY(SELECT node FROM skipped)
          INTO v_runs, v_wave;
        v_ready := v_ready || v_runs;
        v_closed := v_closed + cardinality(v_wave);
        v_decide := '{}';
    END LOOP;

    IF cardinality(v_ready) > 0 AND v_running THEN
        WITH released AS (
            UPDATE cyclone.steps SET status = 'available', available_at = v_now
             WHERE ctid = ANY (cyclone._step_rows(p_run_id, v_ready)) AND status = 'pending'
            RETURNING action)
        SELECT v_actions || coalesce(array_agg(action), '{}') INTO v_actions FROM released;
    END IF;
    PERFORM cyclone._notify_ready(v_actions);
    IF v_closed = 0 THEN
        RETURN (SELECT status FROM cyclone.runs WHERE run_id = p_run_id);
    END IF;
    RETURN cyclone._run_close(p_run_id, v_closed, v_now);
END;
$$;

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
              FOR UPDATE SKIP LOCKED) c;
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
                                      ELSE s.waiting_for END
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
    -- the same key once per step (docs/performance.md, "The upstream of a fan-out's
    -- leaves, read once per claim"). Each upstream node is one probe of the primary
    -- key by (run_id, node), OFFSET 0 keeping it so: written as node = ANY
    -- (depends_on), PostgreSQL 15 and 16, with statistics of runs of one or two steps,
    -- put only run_id in the index condition and filtered the run's steps by the list,
    -- a read of every step of a fan-out's run for each leaf claimed (docs/performance.md,
    -- "Wide fan-outs on PostgreSQL 15").
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
                                      ELSE s.waiting_for END
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
