-- Calls on Citus cost a shard's node less:
-- * the statements that the functions run on a shard's node EXECUTE over the shard's
--   tables are prepared once per session, with generic plans (_prepared), instead of
--   being parsed and planned at every call;
-- * those functions read the reference tables they need (the clock, the pauses) from
--   the node's own copy (_here), not through Citus, which plans each such read as a
--   distributed query and runs it from text at every call;
-- * a server that sends each node its part (--citus-route) takes a claim's steps of
--   all the shards one node holds in one call there (step_claim_node), and applies a
--   batch's outcomes of those shards in one call (step_complete_node);
-- * _step_candidates_sql is PL/pgSQL, whose statement stays parsed for the session;
--   step_candidates_on and step_candidates_local become volatile, as preparing a
--   statement requires.

-- The names of this node's copies of the reference tables p_tables (Citus keeps one on
-- every node, under the table's shard's name), to read them as the plain tables they
-- are: Citus plans a statement on a reference table as a distributed query and runs it
-- locally from text at every call (0.1-0.45 ms for the reads of the clock, the pauses
-- and the rates). A table's own name on a database that is not distributed, or where
-- this node has no copy. Called by the functions that run on a shard's node.
CREATE FUNCTION cyclone._here(p_tables text[]) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT cyclone.sharded() THEN
        RETURN ARRAY(SELECT format('cyclone.%I', t) FROM unnest(p_tables) t);
    END IF;
    RETURN ARRAY(SELECT CASE WHEN to_regclass(c.name) IS NOT NULL THEN c.name
                             ELSE format('cyclone.%I', c.t) END
                   FROM (SELECT t.t, t.i, format('cyclone.%I', t.t || '_' || s.shardid) AS name
                           FROM unnest(p_tables) WITH ORDINALITY AS t(t, i)
                           LEFT JOIN pg_dist_shard s
                             ON s.logicalrelid = ('cyclone.' || t.t)::regclass) c
                  ORDER BY c.i);
END;
$$;

-- The name of this session's prepared statement of p_sql, whose parameters have the
-- types p_types, prepared now if the session has none. The functions delegated to a
-- shard's node address the shard's tables by name, so their statements are EXECUTEd
-- from text, and Postgres would parse and plan each one at every call (about a
-- millisecond for a claim's); a prepared statement keeps its plan for the session
-- and is planned again only when its tables change. Its name is a hash of its text:
-- another shard's statement, or one a later migration rewrites, is another statement.
-- Run as EXECUTE format('EXECUTE %I(%L, ...)', name, values...): EXECUTE ... USING
-- cannot pass parameters to a prepared statement. Called by step_claim_shard,
-- step_complete_shard, step_candidates_on and step_candidates_local.
CREATE FUNCTION cyclone._prepared(p_types text, p_sql text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_name text := 'cyclone_' || md5(p_types || ';' || p_sql);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_prepared_statements p
                    WHERE p.name = v_name) THEN
        EXECUTE format('PREPARE %I (%s) AS %s', v_name, p_types, p_sql);
    END IF;
    RETURN v_name;
END;
$$;

-- The read of up to $4 ready steps of these actions in one shard whose tables this
-- node holds (p_tables: its steps, step_calls and runs; p_shard its id), in claim
-- order, no locks, with their priority and due time so that shards' answers can be
-- merged in claim order: a statement to EXECUTE with $1 the actions, $2 now, $3 the
-- actions passed over (_claim_shut), $4 the limit, $5 the rated actions, $6 the
-- worker's builds, $7 the paused workflows. Keys already full are not passed over
-- (step_claim_flow counts them under their locks). PL/pgSQL, which keeps its
-- statement parsed for the session, where an SQL function's body is parsed at every
-- call. Called by step_candidates_on and step_candidates_local.
CREATE OR REPLACE FUNCTION cyclone._step_candidates_sql(p_tables text[], p_shard bigint)
RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN format($q$(
        SELECT s.run_id, s.node, s.action, %4$s::bigint AS shard, s.concurrency_key,
               s.concurrency_limit, s.concurrency_key IS NOT NULL OR s.action = ANY ($5),
               s.priority, s.available_at
          FROM %1$s s
         WHERE s.status = 'available' AND s.action = ANY ($1)
           AND s.available_at <= $2 AND s.action <> ALL ($3)
           AND cyclone._build_admits(s.build_id, $6, EXISTS (
                   SELECT 1 FROM %2$s j
                    WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0))
           AND (cardinality($7) = 0
                OR NOT EXISTS (SELECT 1 FROM %3$s w
                                WHERE w.run_id = s.run_id AND w.workflow = ANY ($7)))
         ORDER BY s.priority DESC, s.available_at
         LIMIT $4)$q$, p_tables[1], p_tables[2], p_tables[3], p_shard);
END;
$$;

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
CREATE OR REPLACE FUNCTION cyclone.step_claim_shard(
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
        -- cyclone.now(), from this node's copy of the clock (_here).
        EXECUTE format('SELECT statement_timestamp() + offset_by FROM %s',
                       (cyclone._here(ARRAY['clock']))[1])
           INTO v_now;
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
    RETURN QUERY EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L, %L)',
        cyclone._prepared('uuid[], text[], uuid[], timestamptz, text, interval, text, text[]',
                          format($q$
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
$q$, v_tables[1], v_tables[2], v_tables[3], v_tables[4], v_tables[5])),
        p_runs, p_nodes, ARRAY(SELECT gen_random_uuid() FROM unnest(p_nodes)), v_now,
        p_worker, p_lease, p_build, p_builds);
END;
$$;

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
CREATE OR REPLACE FUNCTION cyclone.step_complete_shard(p_run_id uuid, p_items jsonb, p_logs jsonb)
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
        -- cyclone.now(), from this node's copy of the clock (_here).
        EXECUTE format('SELECT statement_timestamp() + offset_by FROM %s',
                       (cyclone._here(ARRAY['clock']))[1])
           INTO v_now;
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

-- step_candidates_sharded for the one shard of p_run_id, when a multi-shard read cannot
-- be made (a worker node is down): up to p_limit ready steps of these actions on that
-- shard (_step_candidates_sql). Distributed by p_run_id (any run id of the shard):
-- delegated whole to the shard's node, which reads its tables directly. Called by the
-- server for each shard while the read across shards fails, so that the runs on the
-- nodes that are up go on. The rates' periods are seconds: Citus delegates a call only
-- when its arguments are plain values.
CREATE OR REPLACE FUNCTION cyclone.step_candidates_on(
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
CREATE OR REPLACE FUNCTION cyclone.step_candidates_local(
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

-- A claim's part of every shard that one node holds, in one call and one transaction
-- on that node, by a server that sends each node its part (--citus-route): the
-- candidates p_runs / p_nodes (aligned with their shards p_shards, in claim order)
-- taken shard by shard, in that order, as step_claim_shard takes each shard's. Not
-- delegated: called on the node that holds the shards, where each step_claim_shard
-- runs as the plain function it is over that node's shards' tables; a shard that moved
-- away meanwhile is taken run by run through the distributed tables (step_claim_run),
-- from wherever it now is. One round trip and one commit per node instead of per
-- shard. RPC: Claim and Work, on Citus.
CREATE FUNCTION cyclone.step_claim_node(
    p_runs uuid[], p_nodes text[], p_shards bigint[], p_worker text, p_unsafe text[],
    p_lease interval, p_build text DEFAULT NULL, p_builds text[] DEFAULT '{}')
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb, run_deadline timestamptz, traceparent text)
LANGUAGE plpgsql AS $$
DECLARE
    v_group record;
BEGIN
    FOR v_group IN
        SELECT array_agg(u.r ORDER BY u.i) AS runs, array_agg(u.n ORDER BY u.i) AS nodes
          FROM unnest(p_runs, p_nodes, p_shards) WITH ORDINALITY AS u(r, n, s, i)
         GROUP BY u.s
         ORDER BY min(u.i)
    LOOP
        RETURN QUERY
        SELECT * FROM cyclone.step_claim_shard(v_group.runs[1], v_group.runs, v_group.nodes,
                                               p_worker, p_unsafe, p_lease, p_build,
                                               p_builds);
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
