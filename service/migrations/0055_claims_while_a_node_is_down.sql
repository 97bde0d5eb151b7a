-- While a worker node of a Citus cluster is down, the claim's read across shards fails
-- as a whole, and no claim took anything, on any node. The server now reads each shard
-- on its own then (step_candidates_on), so that the runs on the nodes that are up go on.

-- step_candidates_sharded for the one shard of p_run_id, when a multi-shard read cannot
-- be made (a worker node is down): up to p_limit ready steps of these actions on that
-- shard, in claim order, no locks, with their priority and due time so that the server
-- merges the shards' answers in claim order. Distributed by p_run_id (any run id of the
-- shard): delegated whole to the shard's node, which reads its tables directly. Keys
-- already full are not passed over here (step_claim_flow counts them under their
-- locks); rated actions whose window is full are. Called by the server for each shard
-- while the read across shards fails, so that the runs on the nodes that are up go on.
-- The rates' periods are seconds: Citus delegates a call only when its arguments are
-- plain values.
CREATE FUNCTION cyclone.step_candidates_on(
    p_run_id uuid, p_actions text[], p_limit integer, p_rate_actions text[],
    p_rate_counts integer[], p_rate_periods float8[], p_builds text[] DEFAULT '{}')
RETURNS TABLE (run_id uuid, node text, action text, shard bigint, concurrency_key text,
               concurrency_limit integer, flow boolean, priority integer,
               available_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_shut   text[] := '{}';
    v_shard  bigint := 0;
    v_tables text[] := ARRAY['cyclone.steps', 'cyclone.step_calls'];
BEGIN
    IF cardinality(p_rate_actions) > 0 THEN
        v_shut := ARRAY(
            SELECT r.action
              FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods) AS r(action, count, period)
              JOIN cyclone.action_rates t ON t.action = r.action
             WHERE (SELECT coalesce(sum(b.n), 0) FROM unnest(t.lasts, t.counts) AS b(last, n)
                     WHERE b.last > v_now - make_interval(secs => r.period)) >= r.count);
    END IF;
    IF cyclone.sharded() THEN
        v_shard := get_shard_id_for_distribution_column('cyclone.runs', p_run_id);
        v_tables := ARRAY(SELECT format('cyclone.%I', t.name || '_'
                                        || get_shard_id_for_distribution_column(
                                               ('cyclone.' || t.name)::regclass, p_run_id))
                            FROM unnest(ARRAY['steps', 'step_calls']) WITH ORDINALITY AS t(name, i)
                           ORDER BY t.i);
        IF EXISTS (SELECT 1 FROM unnest(v_tables) n WHERE to_regclass(n) IS NULL) THEN
            RETURN;  -- not on the shard's node: nothing is read
        END IF;
    END IF;
    RETURN QUERY EXECUTE format($q$
        SELECT s.run_id, s.node, s.action, $7, s.concurrency_key, s.concurrency_limit,
               s.concurrency_key IS NOT NULL OR s.action = ANY ($5), s.priority,
               s.available_at
          FROM %1$s s
         WHERE s.status = 'available' AND s.action = ANY ($1)
           AND s.available_at <= $2 AND s.action <> ALL ($3)
           AND cyclone._build_admits(s.build_id, $6, EXISTS (
                   SELECT 1 FROM %2$s j
                    WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0))
         ORDER BY s.priority DESC, s.available_at
         LIMIT $4
    $q$, v_tables[1], v_tables[2])
      USING p_actions, v_now, v_shut, p_limit, p_rate_actions, p_builds, v_shard;
END;
$$;
