-- Named queries of the server's db wing: waits (service/db/waits.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: step_wait
-- Wait: a durable function's sleep, event or child wait, ready or suspended.
SELECT w.decision, w.call, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_wait(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid), :step_id,
                         :seq, :function, CAST(:wake_at AS timestamptz), :event,
                         CASE WHEN CAST(:timeout_s AS float8) IS NULL THEN NULL
                              ELSE make_interval(secs => :timeout_s) END,
                         CAST(:child AS uuid)) w;

-- name: child_wait
-- Wait with child_run_id: step_wait, with the parent's and the child's locks taken first.
SELECT w.decision, w.call, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.child_wait(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid), :step_id,
                          :seq, CAST(:child AS uuid)) w;

-- name: event_send
SELECT e.event_id, e.created, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.event_send(CAST(:run_id AS uuid), :event_name, CAST(:payload AS jsonb), :key,
                          :actor) e;
