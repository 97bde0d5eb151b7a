-- A claim on a sharded database reads the worker's unhealthy mark where it picks, as
-- step_claim does on one Postgres: step_claim_run and step_claim_shard refuse a marked
-- worker, and check the mark again in the statement that picks the steps, so that a
-- sweep that freed a step and marked its worker in one commit is seen whole or not at
-- all. The server's check before the candidates, a statement of its own, could miss a
-- sweep that the candidates then saw.
CREATE OR REPLACE FUNCTION cyclone.step_claim_run(
    p_run_id uuid, p_nodes text[], p_worker text, p_unsafe text[], p_lease interval,
    p_build text DEFAULT NULL, p_builds text[] DEFAULT '{}')
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
                            true, true, NULL::float8, NULL::jsonb, NULL::jsonb;
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
    p_lease interval, p_build text DEFAULT NULL, p_builds text[] DEFAULT '{}')
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
                             'cyclone.runs', 'cyclone.worker_health'];
    v_shards text[];
    v_sql    text;
BEGIN
    -- A worker whose lease lapsed is handed nothing (and again in each pick's snapshot).
    IF EXISTS (SELECT 1 FROM cyclone.worker_health h WHERE h.worker_id = p_worker) THEN
        RETURN;
    END IF;
    IF cyclone.sharded() AND cardinality(p_unsafe) = 0 THEN
        v_shards := ARRAY(SELECT format('cyclone.%I', t.name || '_'
                                        || get_shard_id_for_distribution_column(
                                               ('cyclone.' || t.name)::regclass, p_run_id))
                            FROM unnest(ARRAY['steps', 'step_calls', 'step_errors', 'runs',
                                              'worker_health'])
                                 WITH ORDINALITY AS t(name, i)
                           ORDER BY t.i);
        -- Not delegated (called in a transaction block, or the shard moved meanwhile):
        -- the shards are elsewhere, and the distributed tables serve, planned by Citus.
        IF NOT EXISTS (SELECT 1 FROM unnest(v_shards) n WHERE to_regclass(n) IS NULL) THEN
            v_tables := v_shards;
        END IF;
    END IF;
    -- One statement per run; $1 the run, $2 its nodes, $3 their tokens, $4 the time,
    -- $5 the worker, $6 the lease, $7 the worker's build, $8 its set; %1$s steps, %2$s step_calls, %3$s step_errors,
    -- %4$s runs, %5$s worker_health (a reference table: its shard is on every node).
    v_sql := format($q$
            WITH picked AS (
                SELECT s.node, t.token, s.effect_uncertain AS uncertain, s.available_at AS since,
                       s.waiting_for = 'sleep' AS slept, t.i,
                       CASE WHEN s.build_id IS NOT NULL AND EXISTS (
                                 SELECT 1 FROM %2$s j WHERE j.run_id = $1 AND j.node = s.node OFFSET 0)
                            THEN s.build_id ELSE $7 END AS pin
                  FROM %1$s s
                  JOIN unnest($2, $3) WITH ORDINALITY AS t(node, token, i)
                    ON t.node = s.node
                 WHERE s.run_id = $1 AND s.status = 'available' AND s.available_at <= $4
                   AND cyclone._build_admits(s.build_id, $8, EXISTS (
                           SELECT 1 FROM %2$s j WHERE j.run_id = $1 AND j.node = s.node OFFSET 0))
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
$q$, v_tables[1], v_tables[2], v_tables[3], v_tables[4], v_tables[5]);
    FOR v_run IN
        SELECT u.r FROM unnest(p_runs) WITH ORDINALITY AS u(r, i) GROUP BY u.r ORDER BY min(u.i)
    LOOP
        v_nodes := ARRAY(SELECT u.n FROM unnest(p_runs, p_nodes) WITH ORDINALITY AS u(r, n, i)
                          WHERE u.r = v_run ORDER BY u.i);
        IF cardinality(p_unsafe) > 0 THEN
            RETURN QUERY
            SELECT * FROM cyclone.step_claim_run(v_run, v_nodes, p_worker, p_unsafe, p_lease,
                                                 p_build, p_builds);
            CONTINUE;
        END IF;
        v_tokens := ARRAY(SELECT gen_random_uuid() FROM unnest(v_nodes));
        RETURN QUERY EXECUTE v_sql USING v_run, v_nodes, v_tokens, v_now, p_worker, p_lease,
                                         p_build, p_builds;
    END LOOP;
END;
$$;
