-- Named queries of the server's db wing: builds (service/db/builds.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: build_seen
-- A worker declared a build (Work's open, Claim): recorded, with the worker.
SELECT retired FROM cyclone.build_seen(:build_id, :worker_id);

-- name: build_set
-- The builds whose pinned nodes a worker of this build may take (NULL: it is retired),
-- for the claims on Citus, which take it as an argument.
SELECT cyclone._build_set(:build_id) AS builds;

-- name: builds_list
-- ListBuilds (or one build, with :build_id): each build with its set, its latest
-- workers, and its unfinished nodes with a journal (read through steps_build_idx).
SELECT b.build_id, b.created_at, b.retired_at,
       ARRAY(SELECT o.build_id FROM cyclone.builds o WHERE o.set_id = b.set_id
              ORDER BY o.build_id) AS compatible,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('worker_id', w.worker_id,
                                                     'seen_at', w.seen_at)
                                  ORDER BY w.seen_at DESC, w.worker_id), '[]')
          FROM (SELECT w.worker_id, w.seen_at FROM cyclone.build_workers w
                 WHERE w.build_id = b.build_id
                 ORDER BY w.seen_at DESC, w.worker_id LIMIT 20) w) AS workers,
       p.nodes AS pinned_nodes, p.runs AS pinned_runs
  FROM cyclone.builds b
 CROSS JOIN LATERAL (
       SELECT count(*) AS nodes, count(DISTINCT s.run_id) AS runs
         FROM cyclone.steps s
        WHERE s.build_id = b.build_id AND s.finished_at IS NULL
          AND EXISTS (SELECT 1 FROM cyclone.step_calls j
                       WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0)) p
 WHERE CAST(:build_id AS text) IS NULL OR b.build_id = :build_id
 ORDER BY b.created_at, b.build_id;

-- name: build_runs
-- ListBuildRuns: the runs with unfinished nodes pinned to a build, oldest first.
SELECT r.run_id::text AS run_id, r.workflow, n.nodes
  FROM (SELECT s.run_id, array_agg(s.node ORDER BY s.node) AS nodes
          FROM cyclone.steps s
         WHERE s.build_id = :build_id AND s.finished_at IS NULL
         GROUP BY s.run_id) n
  JOIN cyclone.runs r ON r.run_id = n.run_id
 ORDER BY r.created_at, r.run_id
 LIMIT :limit;

-- name: build_compatible
SELECT ready FROM cyclone.build_compatible(:build_id, :with_id);

-- name: build_retire
SELECT cyclone.build_retire(:build_id);

-- name: build_move
SELECT nodes, runs, ready FROM cyclone.build_move(:from_id, :to_id, :actor, :reason);
