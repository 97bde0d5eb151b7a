-- Build pinning (docs/durable-functions.md, "Build pinning"): a worker may declare a
-- build id, the claim records on each node the build that started its body
-- (steps.build_id), and a node with a journal is handed only to workers of a compatible
-- build. The builds table, its operator functions, and the claims (step_claim and the
-- Citus claims of 95_shards.sql) with the build's filter: each takes the worker's build
-- as a new last argument with a default, so a server not upgraded yet calls them as
-- before.

ALTER TABLE cyclone.steps ADD COLUMN build_id text;

-- The unfinished steps of each build (ListBuilds, build_move): none while no worker
-- declares a build, so a claim of such steps never writes to it.
CREATE INDEX steps_build_idx ON cyclone.steps (build_id)
    WHERE build_id IS NOT NULL AND finished_at IS NULL;

-- Every build a worker declared, with its compatibility set (the build_id of the set's
-- first build; a build starts in a set of its own) and when an operator retired it.
-- Written by build_seen (a worker's WorkOpen or Claim), build_compatible and
-- build_retire; never by the claim.
CREATE TABLE cyclone.builds (
    build_id   text        PRIMARY KEY,
    set_id     text        NOT NULL,
    created_at timestamptz NOT NULL,
    retired_at timestamptz
);

-- The workers seen declaring each build, with when they last did (build_seen).
CREATE TABLE cyclone.build_workers (
    build_id  text        NOT NULL REFERENCES cyclone.builds ON DELETE CASCADE,
    worker_id text        NOT NULL,
    seen_at   timestamptz NOT NULL,
    PRIMARY KEY (build_id, worker_id)
);

-- The rule of build pinning, in one place: whether a worker whose build's set is
-- p_builds (empty for a worker without a build) may take a node pinned to p_pin (NULL:
-- unpinned) that has a journal (p_journaled). A node with no journal replays nothing, so
-- any worker may take it, whatever build claimed it before. A plain SQL expression, so
-- that the planner inlines it: each claim calls it with p_journaled an EXISTS on the
-- node's journal, which is evaluated only for a node pinned to a build outside the
-- worker's set (OR is read left to right); an unpinned node costs one NULL test. The
-- EXISTS ends in OFFSET 0, so that it stays one probe of the journal's key per row:
-- without it the planner may make it a hashed subplan, a read of the whole journal
-- table the first time a claim meets a pinned node.
-- Called by step_claim, step_candidates_sharded, step_claim_run and step_claim_shard.
CREATE FUNCTION cyclone._build_admits(p_pin text, p_builds text[], p_journaled boolean)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_pin IS NULL OR p_pin = ANY (p_builds) OR NOT p_journaled
$$;

-- The builds whose pinned nodes a worker of build p_build may take: those of its
-- compatibility set, itself included ('{}' for a worker without a build; its own alone
-- for a build not recorded yet). NULL when p_build is retired: its workers take
-- nothing. Called by step_claim, and by the server before a claim on Citus.
CREATE FUNCTION cyclone._build_set(p_build text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_build record;
BEGIN
    IF p_build IS NULL THEN
        RETURN '{}';
    END IF;
    SELECT b.set_id, b.retired_at INTO v_build FROM cyclone.builds b WHERE b.build_id = p_build;
    IF NOT FOUND THEN
        RETURN ARRAY[p_build];
    END IF;
    IF v_build.retired_at IS NOT NULL THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY(SELECT b.build_id FROM cyclone.builds b WHERE b.set_id = v_build.set_id
                  ORDER BY b.build_id);
END;
$$;

-- A worker declared build p_build: the build is recorded (in a set of its own) if it
-- is new, and the worker as seen now. Returns whether the build is retired. Called by
-- the server at a Work stream's open and, every few seconds per worker, at Claim.
CREATE FUNCTION cyclone.build_seen(p_build text, p_worker text, OUT retired boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    INSERT INTO cyclone.builds (build_id, set_id, created_at)
    VALUES (p_build, p_build, v_now)
    ON CONFLICT (build_id) DO NOTHING;
    INSERT INTO cyclone.build_workers AS w (build_id, worker_id, seen_at)
    VALUES (p_build, p_worker, v_now)
    ON CONFLICT (build_id, worker_id) DO UPDATE SET seen_at = greatest(w.seen_at, excluded.seen_at);
    retired := (SELECT b.retired_at IS NOT NULL FROM cyclone.builds b WHERE b.build_id = p_build);
END;
$$;

-- Raises CY002 unless p_build is recorded; returns its row, locked.
CREATE FUNCTION cyclone._build_get(p_build text) RETURNS cyclone.builds
LANGUAGE plpgsql AS $$
DECLARE
    v_build cyclone.builds;
BEGIN
    SELECT * INTO v_build FROM cyclone.builds b WHERE b.build_id = p_build FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown build %: no worker declared it', p_build
            USING ERRCODE = 'CY002';
    END IF;
    RETURN v_build;
END;
$$;

-- Makes build p_build compatible with build p_with: p_build joins p_with's set, so the
-- workers of either take the nodes pinned to the other (and to the rest of the set).
-- CY002 for an unknown build, CY004 when both are the same, CY003 when either is
-- retired. Returns the actions of the ready nodes pinned to the set (their workers may
-- now take them) for the server to wake its claims. RPC: SetBuildCompatible.
CREATE FUNCTION cyclone.build_compatible(p_build text, p_with text, OUT ready text)
LANGUAGE plpgsql AS $$
DECLARE
    v_build cyclone.builds;
    v_with  cyclone.builds;
BEGIN
    IF p_build = p_with THEN
        RAISE EXCEPTION 'build % is compatible with itself already', p_build
            USING ERRCODE = 'CY004';
    END IF;
    -- Locked in name order, so that two declarations cannot wait on each other.
    IF p_build < p_with THEN
        v_build := cyclone._build_get(p_build);
        v_with := cyclone._build_get(p_with);
    ELSE
        v_with := cyclone._build_get(p_with);
        v_build := cyclone._build_get(p_build);
    END IF;
    IF v_build.retired_at IS NOT NULL OR v_with.retired_at IS NOT NULL THEN
        RAISE EXCEPTION 'build % is retired: a retired build joins no set',
            CASE WHEN v_build.retired_at IS NOT NULL THEN p_build ELSE p_with END
            USING ERRCODE = 'CY003';
    END IF;
    UPDATE cyclone.builds b SET set_id = v_with.set_id WHERE b.build_id = p_build;
    ready := (SELECT string_agg(DISTINCT s.action, ',')
                FROM cyclone.builds b
                JOIN cyclone.steps s ON s.build_id = b.build_id
               WHERE b.set_id = v_with.set_id AND s.finished_at IS NULL
                 AND s.status = 'available');
END;
$$;

-- Retires build p_build: its workers take no node from then on (the claim gives them
-- nothing), its nodes wait for a compatible build's workers or for build_move. Retiring
-- a retired build changes nothing. CY002 for an unknown build. RPC: RetireBuild.
CREATE FUNCTION cyclone.build_retire(p_build text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cyclone._build_get(p_build);
    UPDATE cyclone.builds b SET retired_at = cyclone.now()
     WHERE b.build_id = p_build AND b.retired_at IS NULL;
END;
$$;

-- Moves the unfinished nodes pinned to the retired build p_from to build p_to: their
-- later attempts go to p_to's workers (and its set's). Each run moved gets an audit
-- entry (action build_move, with the nodes moved). Returns how many nodes and runs
-- moved, and the actions of the ready ones for the server to wake its claims. CY002 for
-- an unknown build, CY003 when p_from is not retired or p_to is, CY004 when both are the
-- same. RPC: MoveBuild.
CREATE FUNCTION cyclone.build_move(
    p_from text, p_to text, p_actor text, p_reason text,
    OUT nodes integer, OUT runs integer, OUT ready text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := cyclone.now();
    v_from cyclone.builds;
    v_to   cyclone.builds;
BEGIN
    IF p_from = p_to THEN
        RAISE EXCEPTION 'build % cannot be moved to itself', p_from USING ERRCODE = 'CY004';
    END IF;
    IF p_from < p_to THEN
        v_from := cyclone._build_get(p_from);
        v_to := cyclone._build_get(p_to);
    ELSE
        v_to := cyclone._build_get(p_to);
        v_from := cyclone._build_get(p_from);
    END IF;
    IF v_from.retired_at IS NULL THEN
        RAISE EXCEPTION 'build % is not retired: retire it before moving its nodes', p_from
            USING ERRCODE = 'CY003';
    END IF;
    IF v_to.retired_at IS NOT NULL THEN
        RAISE EXCEPTION 'build % is retired: move to a build in service', p_to
            USING ERRCODE = 'CY003';
    END IF;
    WITH moved AS (
        UPDATE cyclone.steps s SET build_id = p_to
         WHERE s.build_id = p_from AND s.finished_at IS NULL
        RETURNING s.run_id, s.node, s.action, s.status
    ), audited AS (
        INSERT INTO cyclone.audit (run_id, action, actor, reason, details, at)
        SELECT m.run_id, 'build_move', p_actor, coalesce(p_reason, ''),
               jsonb_build_object('from', p_from, 'to', p_to,
                                  'nodes', jsonb_agg(m.node ORDER BY m.node)),
               v_now
          FROM moved m GROUP BY m.run_id
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM audited),
           (SELECT string_agg(DISTINCT m.action, ',') FROM moved m WHERE m.status = 'available')
      INTO nodes, runs, ready;
END;
$$;


DROP FUNCTION cyclone.step_claim(text, text[], text[], integer, interval, text[], integer[],
                                 interval[]);
DROP FUNCTION cyclone.step_claim_run(uuid, text[], text, text[], interval);
DROP FUNCTION cyclone.step_claim_shard(uuid, uuid[], text[], text, text[], interval);
DROP FUNCTION cyclone.step_claim_flow(uuid[], text[], text[], text[], integer[], text, text[],
                                      interval, integer, text[], integer[], interval[]);
DROP FUNCTION cyclone.step_candidates_sharded(text[], integer, text[], integer[], interval[]);

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
    -- A worker whose lease lapsed is handed nothing until it shows it is alive.
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

-- step_claim for the ready steps p_nodes of one run, which a multi-shard read found
-- (step_candidates_sharded): the same rows, the same changes, on one shard.
-- Each step is taken only if it is still available and due (FOR UPDATE SKIP LOCKED: a
-- step another claim holds or took is passed over), so candidates read by several
-- servers at once are handed out once. An uncertain step of an action the worker
-- marks unsafe blocks the run instead and is returned first with blocked = true (as
-- _block_uncertain does). Flow control (rate limits, concurrency keys) is not applied
-- here: it counts across runs, under locks step_claim_flow takes before calling this.
-- Builds as in step_claim: p_build the worker's (NULL: none), p_builds its set
-- (cyclone._build_set, read by the server on the coordinator); a step the worker's
-- build may not take (_build_admits) is passed over.
-- Called by step_claim_shard and step_claim_flow, on Citus.
CREATE FUNCTION cyclone.step_claim_run(
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

-- A claim on a sharded database, its first read (Store._claim_sharded): up to p_limit
-- ready steps of these actions across every shard, highest priority first, then oldest
-- (step_claim's order), no locks, each with its run's shard and whether flow control
-- applies to it (flow: it has a concurrency key, or its action is one the worker
-- declares rate limited, p_rate_actions with p_rate_counts per p_rate_periods). As in
-- step_claim's walk, keys already full and rated actions whose window is full (as last
-- written) are passed over, so that they do not fill the batch; step_claim_flow counts
-- both again under their locks. Keys are looked at only when the read met a keyed step.
-- Steps the worker's build may not take (p_builds its set, as in step_claim_run) are
-- passed over too.
-- RPC: Claim, on Citus.
CREATE FUNCTION cyclone.step_candidates_sharded(
    p_actions text[], p_limit integer, p_rate_actions text[], p_rate_counts integer[],
    p_rate_periods interval[], p_builds text[] DEFAULT '{}')
RETURNS TABLE (run_id uuid, node text, action text, shard bigint, concurrency_key text,
               concurrency_limit integer, flow boolean)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_shut   text[] := '{}';
    v_full   text[] := '{}';
    v_runs   uuid[];
    v_nodes  text[];
    v_acts   text[];
    v_keys   text[];
    v_limits integer[];
BEGIN
    IF cardinality(p_rate_actions) > 0 THEN
        v_shut := ARRAY(
            SELECT r.action
              FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods) AS r(action, count, period)
              JOIN cyclone.action_rates t ON t.action = r.action
             WHERE (SELECT coalesce(sum(b.n), 0) FROM unnest(t.lasts, t.counts) AS b(last, n)
                     WHERE b.last > v_now - r.period) >= r.count);
    END IF;
    FOR pass IN 1 .. 2 LOOP
        SELECT array_agg(c.run_id ORDER BY c.i), array_agg(c.node ORDER BY c.i),
               array_agg(c.action ORDER BY c.i), array_agg(c.concurrency_key ORDER BY c.i),
               array_agg(c.concurrency_limit ORDER BY c.i)
          INTO v_runs, v_nodes, v_acts, v_keys, v_limits
          FROM (SELECT s.run_id, s.node, s.action, s.concurrency_key, s.concurrency_limit,
                       row_number() OVER (ORDER BY s.priority DESC, s.available_at) AS i
                  FROM (SELECT s.run_id, s.node, s.action, s.concurrency_key,
                               s.concurrency_limit, s.priority, s.available_at
                          FROM cyclone.steps s
                         WHERE s.status = 'available' AND s.action = ANY (p_actions)
                           AND s.available_at <= v_now AND s.action <> ALL (v_shut)
                           AND (s.concurrency_key IS NULL OR s.concurrency_key <> ALL (v_full))
                           AND cyclone._build_admits(s.build_id, p_builds, EXISTS (
                                   SELECT 1 FROM cyclone.step_calls j
                                    WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0))
                         ORDER BY s.priority DESC, s.available_at
                         LIMIT p_limit) s) c;
        EXIT WHEN pass = 2 OR v_runs IS NULL
                  OR NOT EXISTS (SELECT 1 FROM unnest(v_keys) k WHERE k IS NOT NULL);
        -- The keys with as many running steps as their limit (a multi-shard read).
        v_full := ARRAY(SELECT k.concurrency_key FROM cyclone.steps k
                         WHERE k.status = 'running' AND k.concurrency_key IS NOT NULL
                         GROUP BY k.concurrency_key
                        HAVING count(*) >= min(k.concurrency_limit));
        EXIT WHEN NOT EXISTS (SELECT 1 FROM unnest(v_keys) k WHERE k = ANY (v_full));
    END LOOP;
    IF v_runs IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT u.run_id, u.node, u.action, u.shard, u.concurrency_key, u.concurrency_limit,
           u.concurrency_key IS NOT NULL OR u.action = ANY (p_rate_actions)
      FROM unnest(v_runs, v_nodes, v_acts, cyclone._shards_of(v_runs), v_keys, v_limits)
           WITH ORDINALITY AS u(run_id, node, action, shard, concurrency_key,
                                concurrency_limit, i)
     ORDER BY u.i;
END;
$$;

-- step_claim_run for the steps p_nodes of the runs p_runs (aligned), all of one shard,
-- in one call: distributed by p_run_id (any of p_runs), a call is delegated whole to
-- the node holding that shard and is one single-shard transaction there, one round trip
-- for the shard's part of a claim. The same rows and changes as step_claim_run, in one
-- statement per run instead of five: on a worker node Citus plans each statement twice
-- (as a distributed query, then as its shard's), which cost more than the work, and
-- each statement names its run, so it stays on the shard (a statement over several
-- runs was planned for every shard). When the worker marks actions unsafe, the runs
-- are taken by step_claim_run (an uncertain step blocks its run there). Only steps
-- without flow control are passed here (step_candidates_sharded's flow = false); the
-- others go through step_claim_flow. Builds as in step_claim_run. RPC: Claim, on Citus.
CREATE FUNCTION cyclone.step_claim_shard(
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
                             'cyclone.runs'];
    v_shards text[];
    v_sql    text;
BEGIN
    IF cyclone.sharded() AND cardinality(p_unsafe) = 0 THEN
        v_shards := ARRAY(SELECT format('cyclone.%I', t.name || '_'
                                        || get_shard_id_for_distribution_column(
                                               ('cyclone.' || t.name)::regclass, p_run_id))
                            FROM unnest(ARRAY['steps', 'step_calls', 'step_errors', 'runs'])
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
    -- %4$s runs.
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
$q$, v_tables[1], v_tables[2], v_tables[3], v_tables[4]);
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

-- The part of a claim on a sharded database that flow control applies to: the
-- candidates p_runs / p_nodes (aligned with their p_actions, p_keys and p_limits, in
-- claim order; step_candidates_sharded's flow = true) admitted as step_claim admits
-- them, under the same locks, taken on the coordinator, so that they hold across
-- shards: each rate-limited action's row of action_rates (_rate_room, in action order),
-- then the keys' locks and their running steps counted across shards (_keys_room).
-- Candidates are admitted in order while their action's window and their key have
-- room, up to p_limit; each run's are then taken by step_claim_run, and the admitted
-- claims join their action's window (counted when admitted: a step another claim took
-- meanwhile still counts, so a window may hold fewer claims than it could, never
-- more). The locks are held until this call's transaction commits, after the shards
-- have: a later claim counts what this one took. Not delegated: one transaction on
-- the coordinator, distributed when it takes from several shards or writes a rate.
-- Builds as in step_claim_run. RPC: Claim, on Citus.
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
    journal jsonb)
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
