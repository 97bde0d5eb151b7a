-- A server that sends each node its part (--citus-route) takes a claim's steps of all
-- the shards one node holds in one call there (step_claim_node), and applies a batch's
-- outcomes of those shards in one call (step_complete_node): one round trip and one
-- commit per node instead of per shard.

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
