-- Claims on Citus read each node's shards where they live: a server that sends each
-- node its part (--citus-route) asks every node that holds shards for the ready steps
-- of its own shards (step_candidates_local), instead of one multi-shard read through
-- the coordinator. step_candidates_on reads one shard through the same function.

-- The read of up to $4 ready steps of these actions in one shard whose tables this
-- node holds (p_tables: its steps, step_calls and runs; p_shard its id), in claim
-- order, no locks, with their priority and due time so that shards' answers can be
-- merged in claim order: a statement to EXECUTE with $1 the actions, $2 now, $3 the
-- actions passed over (_claim_shut), $4 the limit, $5 the rated actions, $6 the
-- worker's builds, $7 the paused workflows. Keys already full are not passed over
-- (step_claim_flow counts them under their locks). Called by step_candidates_on and
-- step_candidates_local.
CREATE FUNCTION cyclone._step_candidates_sql(p_tables text[], p_shard bigint)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format($q$(
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
$$;

-- The actions a claim passes over: paused ones (75_pauses.sql) and, of the rated ones
-- the worker declares (p_rate_actions, p_rate_counts per p_rate_periods seconds), those
-- whose window is full as last written. Called by step_candidates_on and
-- step_candidates_local.
CREATE FUNCTION cyclone._claim_shut(
    p_now timestamptz, p_rate_actions text[], p_rate_counts integer[],
    p_rate_periods float8[])
RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'action')
           || ARRAY(SELECT r.action
                      FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods)
                           AS r(action, count, period)
                      JOIN cyclone.action_rates t ON t.action = r.action
                     WHERE (SELECT coalesce(sum(b.n), 0)
                              FROM unnest(t.lasts, t.counts) AS b(last, n)
                             WHERE b.last > p_now - make_interval(secs => r.period))
                           >= r.count);
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
LANGUAGE plpgsql STABLE AS $$
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
    RETURN QUERY EXECUTE cyclone._step_candidates_sql(v_tables, v_shard)
      USING p_actions, v_now,
            cyclone._claim_shut(v_now, p_rate_actions, p_rate_counts, p_rate_periods),
            p_limit, p_rate_actions, p_builds,
            ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'workflow');
END;
$$;

-- The claim's first read on one node, by a server that sends each node its part
-- (--citus-route): up to p_limit ready steps of these actions in the shards of the runs
-- that this node holds, in claim order (one statement over each shard's tables,
-- _step_candidates_sql; the server merges the nodes' answers). Not delegated: called
-- on each node that holds shards, it reads that node's shards' tables directly,
-- without a multi-shard query through the coordinator. Nothing on a node that holds
-- none, or on a database that is not distributed.
CREATE FUNCTION cyclone.step_candidates_local(
    p_actions text[], p_limit integer, p_rate_actions text[], p_rate_counts integer[],
    p_rate_periods float8[], p_builds text[] DEFAULT '{}')
RETURNS TABLE (run_id uuid, node text, action text, shard bigint, concurrency_key text,
               concurrency_limit integer, flow boolean, priority integer,
               available_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now timestamptz := cyclone.now();
    v_sql text;
BEGIN
    IF NOT cyclone.sharded() THEN
        RETURN;
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
    RETURN QUERY EXECUTE 'SELECT * FROM (' || v_sql
                         || ') c ORDER BY c.priority DESC, c.available_at LIMIT $4'
      USING p_actions, v_now,
            cyclone._claim_shut(v_now, p_rate_actions, p_rate_counts, p_rate_periods),
            p_limit, p_rate_actions, p_builds,
            ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'workflow');
END;
$$;
