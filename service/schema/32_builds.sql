-- Builds: which code a durable body started on (docs/durable-functions.md, "Build
-- pinning"). A worker may declare a build id; the claim records it on the node
-- (steps.build_id), and a node with a journal is then handed only to workers of a build
-- compatible with it: the same build, or one of the same compatibility set. Operators
-- declare sets, retire builds and move a retired build's nodes (AdminService).

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
