-- Named queries of the server's db wing: completions on a sharded database
-- (service/db/shard_reports.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: step_complete_shard
-- Delegated whole to the node of :run_id's shard (a call outside a transaction block):
-- the settings read here are that node's transaction's.
SELECT i, step_status, run_status, duplicate, retry_at, error_state, error_message,
       error_detail,
       current_setting('cyclone.ready', true) AS ready,
       current_setting('cyclone.woken', true) AS woken
  FROM cyclone.step_complete_shard(CAST(:run_id AS uuid), CAST(:items AS jsonb),
                                   CAST(:logs AS jsonb));

-- name: step_complete_node
-- On the node that holds the shards of :shards (a routed call, not delegated): the
-- settings read here are that node's transaction's.
SELECT i, step_status, run_status, duplicate, retry_at, error_state, error_message,
       error_detail,
       current_setting('cyclone.ready', true) AS ready,
       current_setting('cyclone.woken', true) AS woken
  FROM cyclone.step_complete_node(CAST(:items AS jsonb), CAST(:shards AS bigint[]),
                                  CAST(:logs AS jsonb));

-- name: child_wake
-- Delegated to the parent's node.
SELECT current_setting('cyclone.ready', true) AS ready
  FROM cyclone.child_wake(CAST(:run_id AS uuid), CAST(:child AS uuid));

-- name: child_wake_done
-- Delegated to the child's node.
SELECT cyclone.child_wake_done(CAST(:run_id AS uuid));

-- name: child_wakes_pending
SELECT run_id::text AS run_id, parent_run_id::text AS parent_run_id
  FROM cyclone.child_wakes_pending(:limit);

-- name: shards_of
-- The shard of each run of :runs (aligned): to group a batch's outcomes by shard.
SELECT cyclone._shards_of(CAST(:runs AS uuid[])) AS shards;
