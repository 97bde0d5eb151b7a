-- Named queries of the Cyclone server. Each block starts with "-- name: <name>" and is
-- loaded by service.store; parameters are bound (:name), never formatted in.
-- Transitions are functions (service/migrations); these are their calls and the reads.

-- Transitions also return `ready`: the actions they made claimable (see
-- 0003_deferred_notify.sql), read in the same statement.

-- name: run_submit
SELECT run_id, created, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.run_submit(CAST(:run_id AS uuid), :workflow, :submit_key,
                          CAST(:input AS jsonb), CAST(:nodes AS jsonb));

-- name: step_claim
SELECT *
  FROM cyclone.step_claim(:worker_id, CAST(:actions AS text[]), CAST(:unsafe AS text[]),
                          :limit, make_interval(secs => :lease_s));

-- name: steps_release
-- Hands back steps that a Claim took but could not deliver (its caller went away):
-- available again as if never claimed, attempt and uncertainty as they were.
UPDATE cyclone.steps s
   SET status = 'available', attempt = s.attempt - 1, available_at = cyclone.now(),
       lease_expires_at = NULL, effect_uncertain = r.uncertain
  FROM unnest(CAST(:run_ids AS uuid[]), CAST(:nodes AS text[]), CAST(:tokens AS uuid[]),
              CAST(:uncertain AS boolean[])) AS r(run_id, node, token, uncertain)
 WHERE s.run_id = r.run_id AND s.node = r.node AND s.status = 'running'
   AND s.lease_token = r.token
   AND EXISTS (SELECT 1 FROM cyclone.runs u WHERE u.run_id = s.run_id AND u.status = 'running')
RETURNING s.action AS ready;

-- name: step_next_due
-- Earliest time a ready step of these actions becomes claimable (backoff).
SELECT extract(epoch FROM min(available_at) - cyclone.now()) AS seconds
  FROM cyclone.steps
 WHERE status = 'available' AND action = ANY (CAST(:actions AS text[]));

-- name: step_heartbeat
SELECT lease_expires_at, cancelled
  FROM cyclone.step_heartbeat(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid),
                              make_interval(secs => :lease_s), CAST(:progress AS jsonb));

-- name: step_complete
SELECT step_status, run_status, duplicate, retry_at,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_complete(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid),
                             CAST(:output AS jsonb));

-- name: step_fail
SELECT step_status, run_status, duplicate, retry_at,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_fail(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid), :type,
                         :message, :details, :retryable,
                         CASE WHEN CAST(:retry_after_s AS float8) IS NULL THEN NULL
                              ELSE make_interval(secs => :retry_after_s) END);

-- name: step_complete_many
SELECT i, step_status, run_status, duplicate, retry_at, error_state, error_message,
       error_detail,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_complete_many(CAST(:items AS jsonb));

-- name: step_retry
SELECT nodes, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_retry(CAST(:run_id AS uuid), CAST(:nodes AS text[]), :actor, :reason)
       AS nodes;

-- name: step_resolve
SELECT current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_resolve(CAST(:run_id AS uuid), :node, :choice, CAST(:value AS jsonb),
                            :actor, :reason);

-- name: run_cancel
SELECT cyclone.run_cancel(CAST(:run_id AS uuid), :actor, :reason);

-- name: sweep
SELECT reclaimed, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.sweep(:limit) AS reclaimed;

-- name: run_get
-- A run with its steps, their errors and the audit trail, read in one statement so
-- that the picture is consistent.
SELECT r.run_id, r.workflow, r.status, r.input, r.error, r.submit_key, r.created_at,
       r.updated_at, r.finished_at,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'node', s.node, 'action', s.action, 'status', s.status,
                   'attempt', s.attempt, 'max_attempts', s.max_attempts,
                   'depends_on', s.depends_on, 'trigger_rule', s.trigger_rule,
                   'input', s.input, 'output', s.output, 'progress', s.progress,
                   'worker_id', s.worker_id,
                   'lease_expires_at', CASE WHEN s.status = 'running' THEN s.lease_expires_at END,
                   'available_at', CASE WHEN s.status = 'available' THEN s.available_at END,
                   'started_at', s.started_at, 'finished_at', s.finished_at,
                   'effect_uncertain', s.effect_uncertain,
                   'timeout_s', extract(epoch FROM s.timeout)) ORDER BY s.position), '[]')
          FROM cyclone.steps s WHERE s.run_id = r.run_id) AS steps,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'node', e.node, 'attempt', e.attempt, 'kind', e.kind, 'type', e.type,
                   'message', e.message, 'details', e.details, 'retryable', e.retryable,
                   'at', e.at) ORDER BY e.at), '[]')
          FROM cyclone.step_errors e WHERE e.run_id = r.run_id) AS errors,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'action', a.action, 'node', a.node, 'actor', a.actor, 'reason', a.reason,
                   'details', a.details, 'at', a.at) ORDER BY a.id), '[]')
          FROM cyclone.audit a WHERE a.run_id = r.run_id) AS audit
  FROM cyclone.runs r
 WHERE r.run_id = CAST(:run_id AS uuid);

-- name: runs_list
-- Newest first, keyset-paged on (created_at, run_id).
SELECT r.run_id, r.workflow, r.status, r.input, r.error, r.submit_key, r.created_at,
       r.updated_at, r.finished_at,
       (SELECT jsonb_object_agg(c.status, c.n)
          FROM (SELECT s.status, count(*) AS n FROM cyclone.steps s
                 WHERE s.run_id = r.run_id GROUP BY s.status) c) AS step_counts
  FROM cyclone.runs r
 WHERE (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
   AND (CAST(:statuses AS text[]) IS NULL OR r.status = ANY (CAST(:statuses AS text[])))
   AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
   AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
   AND (CAST(:after_created AS timestamptz) IS NULL
        OR (r.created_at, r.run_id) < (CAST(:after_created AS timestamptz),
                                       CAST(:after_run_id AS uuid)))
 ORDER BY r.created_at DESC, r.run_id DESC
 LIMIT :limit;

-- name: clock_advance
-- Tests only: moves cyclone.now() forward.
UPDATE cyclone.clock SET offset_by = offset_by + make_interval(secs => :seconds);
