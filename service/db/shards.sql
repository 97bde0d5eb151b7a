-- Named queries of the server's db wing: shards (service/db/shards.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: step_candidates_sharded
-- A worker marked unhealthy (a lease of it lapsed) is handed nothing: asked here, in the
-- claim's first statement, and again by the shards' functions in the snapshot of their
-- pick (step_claim does it on one Postgres).
SELECT run_id, node, action, shard, concurrency_key, concurrency_limit, flow
  FROM cyclone.step_candidates_sharded(
           CAST(:actions AS text[]), :limit, CAST(:rate_actions AS text[]),
           CAST(:rate_counts AS integer[]),
           ARRAY(SELECT make_interval(secs => p)
                   FROM unnest(CAST(:rate_periods AS float8[])) WITH ORDINALITY AS u(p, i)
                  ORDER BY u.i),
           CAST(:builds AS text[]))
 WHERE NOT EXISTS (SELECT 1 FROM cyclone.worker_health h WHERE h.worker_id = :worker_id);

-- name: step_candidates_on
-- Delegated whole to the node of :run_id's shard: that shard's candidates alone.
SELECT run_id, node, action, shard, concurrency_key, concurrency_limit, flow, priority,
       extract(epoch FROM available_at)::float8 AS due
  FROM cyclone.step_candidates_on(
           CAST(:run_id AS uuid), CAST(:actions AS text[]), :limit,
           CAST(:rate_actions AS text[]), CAST(:rate_counts AS integer[]),
           CAST(:rate_periods AS float8[]), CAST(:builds AS text[]));

-- name: shard_representatives
-- A run id (made up: no such run) in each shard of the runs, the argument of a call
-- delegated to that shard's node; 64 tries per shard leave none out.
SELECT DISTINCT ON (shard) shard, u::text AS run_id
  FROM (SELECT g.u, get_shard_id_for_distribution_column('cyclone.runs', g.u) AS shard
          FROM (SELECT gen_random_uuid() AS u
                  FROM generate_series(1, 64 * (SELECT count(*)::integer FROM pg_dist_shard
                                                 WHERE logicalrelid = 'cyclone.runs'::regclass))
               ) g) x
 ORDER BY shard, u;

-- name: step_claim_shard
-- Delegated whole to the node of :run_id's shard (a call outside a transaction block).
-- The columns of step_claim, ids as text.
SELECT c.run_id::text AS run_id, c.node, c.action, c.workflow, c.attempt, c.max_attempts,
       c.input, c.run_input::text AS run_input, c.upstream::text AS upstream,
       c.lease_token::text AS lease_token,
       c.lease_expires_at, c.deadline_at, c.progress, c.effect_uncertain, c.blocked,
       c.waited_s, c.upstream_failures, c.journal, c.run_deadline, c.traceparent
  FROM cyclone.step_claim_shard(CAST(:run_id AS uuid), CAST(:runs AS uuid[]),
                                CAST(:nodes AS text[]), :worker_id, CAST(:unsafe AS text[]),
                                make_interval(secs => :lease_s), CAST(:build_id AS text),
                                CAST(:builds AS text[])) c;

-- name: step_claim_node
-- On the node that holds the shards of :shards (a routed call, not delegated). The
-- columns of step_claim, ids as text.
SELECT c.run_id::text AS run_id, c.node, c.action, c.workflow, c.attempt, c.max_attempts,
       c.input, c.run_input::text AS run_input, c.upstream::text AS upstream,
       c.lease_token::text AS lease_token,
       c.lease_expires_at, c.deadline_at, c.progress, c.effect_uncertain, c.blocked,
       c.waited_s, c.upstream_failures, c.journal, c.run_deadline, c.traceparent
  FROM cyclone.step_claim_node(CAST(:runs AS uuid[]), CAST(:nodes AS text[]),
                               CAST(:shards AS bigint[]), :worker_id,
                               CAST(:unsafe AS text[]), make_interval(secs => :lease_s),
                               CAST(:build_id AS text), CAST(:builds AS text[])) c;

-- name: step_claim_flow
-- The columns of step_claim, ids as text.
SELECT c.run_id::text AS run_id, c.node, c.action, c.workflow, c.attempt, c.max_attempts,
       c.input, c.run_input::text AS run_input, c.upstream::text AS upstream,
       c.lease_token::text AS lease_token,
       c.lease_expires_at, c.deadline_at, c.progress, c.effect_uncertain, c.blocked,
       c.waited_s, c.upstream_failures, c.journal, c.run_deadline, c.traceparent
  FROM cyclone.step_claim_flow(CAST(:runs AS uuid[]), CAST(:nodes AS text[]),
                               CAST(:actions AS text[]), CAST(:keys AS text[]),
                               CAST(:limits AS integer[]), :worker_id, CAST(:unsafe AS text[]),
                               make_interval(secs => :lease_s), :limit,
                               CAST(:rate_actions AS text[]), CAST(:rate_counts AS integer[]),
                               ARRAY(SELECT make_interval(secs => p)
                                       FROM unnest(CAST(:rate_periods AS float8[]))
                                            WITH ORDINALITY AS u(p, i) ORDER BY u.i),
                               CAST(:build_id AS text), CAST(:builds AS text[])) c;

-- name: sharded
SELECT cyclone.sharded() AS sharded;

-- name: shard_placements
-- Where each shard of the runs lives (Citus's metadata, on every node): its primary
-- node, whether that is the node this connection is on, and the range of the hashes
-- of the run ids it holds (service/db/shard_hash.py).
SELECT s.shardid AS shard, n.nodename AS host, n.nodeport AS port,
       n.groupid = (SELECT groupid FROM pg_dist_local_group) AS local,
       s.shardminvalue::integer AS low, s.shardmaxvalue::integer AS high
  FROM pg_dist_shard s
  JOIN pg_dist_placement p ON p.shardid = s.shardid
  JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary' AND n.isactive
 WHERE s.logicalrelid = 'cyclone.runs'::regclass
 ORDER BY s.shardid;

-- name: step_candidates_node
-- On one node (not delegated): the ready steps of the shards it holds, each shard's in
-- claim order; the server merges the nodes' answers. As step_candidates_sharded, a
-- worker marked unhealthy is handed nothing (worker_health is on every node).
SELECT run_id, node, action, shard, concurrency_key, concurrency_limit, flow, priority,
       extract(epoch FROM available_at)::float8 AS due
  FROM cyclone.step_candidates_node(
           :worker_id, CAST(:actions AS text[]), :limit, CAST(:rate_actions AS text[]),
           CAST(:rate_counts AS integer[]), CAST(:rate_periods AS float8[]),
           CAST(:builds AS text[]));
