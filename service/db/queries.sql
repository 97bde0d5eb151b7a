-- Named queries of the server's db wing: queries and updates of durable functions
-- (service/db/queries.py; the tables are in service/schema/49_queries_updates.sql).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: update_send
SELECT u.created, u.name, u.args, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.update_send(CAST(:run_id AS uuid), :node, :update_id, :update_name,
                           CAST(:args AS jsonb), :actor) u;

-- name: update_outcome
-- The journal entry of an update, with its node's and run's status (no row: no node).
SELECT s.status AS node_status, r.status AS run_status, c.seq, c.status AS call_status,
       c.output
  FROM cyclone.steps s
  JOIN cyclone.runs r ON r.run_id = s.run_id
  LEFT JOIN cyclone.step_calls c
         ON c.run_id = s.run_id AND c.node = s.node AND c.step_id = :step_id
 WHERE s.run_id = CAST(:run_id AS uuid) AND s.node = :node;

-- name: query_node
-- The node a query asks: its status (no row: no such run or node).
SELECT s.status AS node_status, r.status AS run_status
  FROM cyclone.runs r
  LEFT JOIN cyclone.steps s ON s.run_id = r.run_id AND s.node = :node
 WHERE r.run_id = CAST(:run_id AS uuid);

-- name: query_ask
INSERT INTO cyclone.run_queries (run_id, node, name, args, created_at, expires_at)
VALUES (CAST(:run_id AS uuid), :node, :query_name, CAST(:args AS jsonb), cyclone.now(),
        cyclone.now() + make_interval(secs => :timeout_s))
RETURNING query_id, 'cyclone.inbox:' || run_id AS ready;

-- name: query_answer
SELECT q.answered_at IS NOT NULL AS answered, q.delivered_at IS NOT NULL AS delivered,
       q.result, q.error
  FROM cyclone.run_queries q
 WHERE q.run_id = CAST(:run_id AS uuid) AND q.query_id = :query_id;

-- name: query_forget
DELETE FROM cyclone.run_queries q
 WHERE q.run_id = CAST(:run_id AS uuid) AND q.query_id = :query_id
RETURNING q.query_id;

-- name: query_state_get
SELECT q.value, q.published_at
  FROM cyclone.query_state q
 WHERE q.run_id = CAST(:run_id AS uuid) AND q.node = :node AND q.name = :query_name;

-- name: inbox_answer
-- A worker's answers: items [{run_id, query_id, result, error}]; the runs answered.
UPDATE cyclone.run_queries q
   SET answered_at = cyclone.now(), result = a.result, error = a.error
  FROM jsonb_to_recordset(CAST(:items AS jsonb))
       a(run_id uuid, query_id bigint, result jsonb, error jsonb)
 WHERE q.run_id = a.run_id AND q.query_id = a.query_id AND q.answered_at IS NULL
RETURNING q.run_id;

-- name: inbox_publish
-- Query handlers' values: items [{run_id, node, attempt, name, value}]; a value of an
-- older attempt than the one stored is skipped.
INSERT INTO cyclone.query_state AS q (run_id, node, name, value, attempt, published_at)
SELECT p.run_id, p.node, p.name, p.value, p.attempt, cyclone.now()
  FROM jsonb_to_recordset(CAST(:items AS jsonb))
       p(run_id uuid, node text, attempt integer, name text, value jsonb)
 WHERE EXISTS (SELECT 1 FROM cyclone.steps s WHERE s.run_id = p.run_id AND s.node = p.node)
ON CONFLICT (run_id, node, name) DO UPDATE
   SET value = excluded.value, attempt = excluded.attempt,
       published_at = excluded.published_at
 WHERE q.attempt <= excluded.attempt
RETURNING q.run_id;

-- name: inbox_queries
-- The queries asked of these nodes that no Inbox handed out yet: handed out now.
UPDATE cyclone.run_queries q SET delivered_at = cyclone.now()
  FROM unnest(CAST(:run_ids AS uuid[]), CAST(:nodes AS text[])) n(run_id, node)
 WHERE q.run_id = n.run_id AND q.node = n.node AND q.delivered_at IS NULL
   AND q.expires_at > cyclone.now()
RETURNING q.query_id, q.run_id, q.node, q.name, q.args;

-- name: inbox_updates
-- The updates of these nodes past each cursor that their journal does not record yet.
SELECT u.seq, u.run_id, u.node, u.update_id, u.name, u.args
  FROM unnest(CAST(:run_ids AS uuid[]), CAST(:nodes AS text[]), CAST(:afters AS bigint[]))
       n(run_id, node, after)
  JOIN cyclone.run_updates u ON u.run_id = n.run_id AND u.node = n.node AND u.seq > n.after
 WHERE NOT EXISTS (SELECT 1 FROM cyclone.step_calls c
                    WHERE c.run_id = u.run_id AND c.node = u.node
                      AND c.step_id = 'update:' || u.update_id)
 ORDER BY u.seq;
