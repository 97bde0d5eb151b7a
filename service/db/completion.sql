-- Named queries of the server's db wing: completion (service/db/completion.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: step_complete
-- The server's path: a repeat with the recorded token answers duplicate = true, where the
-- public cyclone.step_complete (a worker's own transaction) raises CY005.
SELECT step_status, run_status, duplicate, retry_at,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone._step_complete(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid),
                             CAST(:output AS jsonb));

-- name: step_fail
SELECT step_status, run_status, duplicate, retry_at,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_fail(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid), :type,
                         :message, :details, :retryable,
                         CASE WHEN CAST(:retry_after_s AS float8) IS NULL THEN NULL
                              ELSE make_interval(secs => :retry_after_s) END);

-- name: step_abandon
-- An unsafe handler stopped without an outcome: the step becomes uncertain and its run
-- blocked (held pending when the run is blocked already).
SELECT step_status, run_status, duplicate, retry_at,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_abandon(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid), :type,
                            :message, :details);

-- name: step_complete_many
SELECT i, step_status, run_status, duplicate, retry_at, error_state, error_message,
       error_detail,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_complete_many(CAST(:items AS jsonb));

-- name: step_call_begin
SELECT decision, run_status, call
  FROM cyclone.step_call_begin(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid),
                               :step_id, :seq, :function, :unsafe, :args_digest);

-- name: step_call_end
-- The server's path: a repeat answers duplicate = true, where the public
-- cyclone.step_call_record (a worker's own transaction) raises CY005. Committed
-- durably, as every transition is: a worker that heard back starts the body's next
-- step call on the strength of it.
SELECT e.duplicate, e.call
  FROM cyclone._step_call_end(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid),
                              :step_id, :seq, :function, :unsafe, CAST(:output AS jsonb),
                              CAST(:error AS jsonb), :args_digest) e;

-- name: step_report_many
-- CompleteMany: step calls ended, step calls begun, then the completions, in one
-- transaction, committed durably (its WAL flushed before the reply): a step call's end
-- is in the body's window of one call, so a worker that heard back may start the
-- body's next step call.
SELECT m.kind, m.i, m.step_status, m.run_status, m.duplicate, m.retry_at, m.decision,
       m.call, m.error_state, m.error_message, m.error_detail,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_report_many(CAST(:ends AS jsonb), CAST(:begins AS jsonb),
                                CAST(:items AS jsonb), :brief) m;

-- Schedules (service/schema/85_schedules.sql) ------------------------------------

-- name: step_logs_add
-- Log lines of held steps, in the transaction of their Heartbeat or completion, before
-- it (cyclone.step_logs_add, service/schema/55_step_logs.sql).
SELECT cyclone.step_logs_add(CAST(:items AS jsonb)) AS kept;
