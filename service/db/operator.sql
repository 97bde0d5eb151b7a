-- Named queries of the server's db wing: operator (service/db/operator.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: step_retry
SELECT nodes, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_retry(CAST(:run_id AS uuid), CAST(:nodes AS text[]), :actor, :reason)
       AS nodes;

-- name: step_resolve
SELECT current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_resolve(CAST(:run_id AS uuid), :node, :choice, CAST(:value AS jsonb),
                            :actor, :reason);

-- name: step_call_resolve
SELECT node, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_call_resolve(CAST(:run_id AS uuid), :node, :step_id, :choice,
                                 CAST(:value AS jsonb), :actor, :reason) AS node;

-- name: run_cancel
-- With the actions it made claimable (a parent's node waiting for a child cancelled
-- here is woken), as the transitions' queries return them.
SELECT c.run_cancel, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.run_cancel(CAST(:run_id AS uuid), :actor, :reason, :keep_children) AS c(run_cancel);

-- name: run_pause
SELECT p.changed, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.run_pause(CAST(:run_id AS uuid), :actor, :reason) AS p(changed);

-- name: run_resume
-- With the actions it made claimable again, as the transitions' queries return them.
SELECT p.changed, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.run_resume(CAST(:run_id AS uuid), :actor, :reason) AS p(changed);

-- name: pause_set
SELECT p.changed, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.pause_set(:kind, :target, :actor, :reason) AS p(changed);

-- name: pause_clear
SELECT p.changed, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.pause_clear(:kind, :target, :actor, :reason) AS p(changed);

-- name: pauses_list
-- The workflows and actions paused now, by kind and name.
SELECT p.kind, p.name, p.actor, p.reason, p.at
  FROM cyclone.pauses p
 ORDER BY p.kind, p.name;

-- name: run_tags_set
SELECT run_tags_set AS tags
  FROM cyclone.run_tags_set(CAST(:run_id AS uuid), CAST(:set AS jsonb),
                            CAST(:remove AS text[]), :max, :actor, :reason) AS run_tags_set;

-- name: workflow_deadline_set
-- Sets (or replaces) the default deadline of a workflow name.
INSERT INTO cyclone.workflow_deadlines AS d (workflow, deadline, set_by, set_at, reason)
VALUES (:workflow, make_interval(secs => :seconds), :actor, cyclone.now(), :reason)
    ON CONFLICT (workflow) DO UPDATE
   SET deadline = EXCLUDED.deadline, set_by = EXCLUDED.set_by, set_at = EXCLUDED.set_at,
       reason = EXCLUDED.reason
RETURNING d.workflow, extract(epoch FROM d.deadline)::float8 AS seconds, d.set_by, d.set_at,
          d.reason;

-- name: workflow_deadline_clear
-- Clears the default deadline of a workflow name; no row when it had none.
DELETE FROM cyclone.workflow_deadlines d WHERE d.workflow = :workflow
RETURNING d.workflow, extract(epoch FROM d.deadline)::float8 AS seconds, d.set_by, d.set_at,
          d.reason;

-- name: workflow_deadlines_list
-- Every default deadline, by workflow name.
SELECT d.workflow, extract(epoch FROM d.deadline)::float8 AS seconds, d.set_by, d.set_at,
       d.reason
  FROM cyclone.workflow_deadlines d
 ORDER BY d.workflow;
