-- Named queries of the server's db wing: runs (service/db/runs.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: run_submit
SELECT run_id, created, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.run_submit(CAST(:run_id AS uuid), :workflow, :submit_key,
                          CAST(:input AS jsonb), CAST(:nodes AS jsonb),
                          CAST(:start_at AS timestamptz), :priority, CAST(:tags AS jsonb),
                          CAST(:deadline AS timestamptz), :traceparent);

-- name: child_start
SELECT child_run_id, created, call, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.child_start(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid), :step_id,
                           :seq, CAST(:child_run_id AS uuid), :workflow,
                           CAST(:input AS jsonb), CAST(:nodes AS jsonb));

-- name: step_explain
-- Everything Explain needs to say why one step is not running, about its run read in
-- one statement so that the picture is consistent. No step columns when the run has no
-- such node. Every table is read by the run's id (:run_id), so that on Citus the
-- statement runs on the run's shard; the counts of other steps (ready_ahead,
-- action_running, key_running) are read apart, across shards: step_explain_counts.
SELECT r.status AS run_status, r.error AS run_error, cyclone.now() AS now,
       s.node, s.action, s.status, s.attempt, s.max_attempts, s.trigger_rule, s.deps_open,
       s.available_at, s.lease_expires_at, s.deadline_at, s.worker_id, s.started_at,
       s.last_heartbeat_at, s.finished_at, s.unsafe, s.effect_uncertain,
       (SELECT jsonb_build_object('attempt', e.attempt, 'kind', e.kind, 'type', e.type,
                                  'message', e.message, 'at', e.at)
          FROM cyclone.step_errors e
         WHERE e.run_id = CAST(:run_id AS uuid) AND e.node = s.node
         ORDER BY e.at DESC LIMIT 1) AS last_error,
       -- The direct upstream nodes, in topological order.
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'node', u.node, 'status', u.status, 'attempt', u.attempt)
                   ORDER BY u.position), '[]')
          FROM cyclone.steps u
         WHERE u.run_id = CAST(:run_id AS uuid) AND u.node = ANY (s.depends_on)) AS upstream,
       -- For a skipped step: the discarded nodes upstream of it, through skipped ones.
       CASE WHEN s.status = 'skipped' THEN (
           WITH RECURSIVE up(node) AS (
               SELECT unnest(s.depends_on)
               UNION
               SELECT unnest(k.depends_on)
                 FROM cyclone.steps k JOIN up ON k.node = up.node
                WHERE k.run_id = CAST(:run_id AS uuid) AND k.status = 'skipped')
           SELECT coalesce(jsonb_agg(jsonb_build_object(
                      'node', f.node, 'status', f.status, 'attempt', f.attempt,
                      'error', (SELECT jsonb_build_object(
                                    'attempt', e.attempt, 'kind', e.kind, 'type', e.type,
                                    'message', e.message, 'at', e.at)
                                  FROM cyclone.step_errors e
                                 WHERE e.run_id = CAST(:run_id AS uuid) AND e.node = f.node
                                 ORDER BY e.at DESC LIMIT 1))
                      ORDER BY f.position), '[]')
             FROM cyclone.steps f JOIN up ON f.node = up.node
            WHERE f.run_id = CAST(:run_id AS uuid) AND f.status = 'discarded') END AS failed_upstream,
       a.polled_at, a.polled_by, a.claimed_at, a.claimed_by,
       NULL::bigint AS ready_ahead, NULL::bigint AS action_running,
       (SELECT jsonb_build_object('actor', c.actor, 'reason', c.reason, 'at', c.at)
          FROM cyclone.audit c
         WHERE c.run_id = CAST(:run_id AS uuid) AND c.action = 'cancel'
         ORDER BY c.id DESC LIMIT 1) AS cancel,
       r.run_id, s.waiting_for, s.resumes, s.recoveries,
       s.concurrency_key, s.concurrency_limit, NULL::bigint AS key_running,
       -- When its action's rate limit opens again, if it is used up now.
       (SELECT t.reopens_at FROM cyclone.action_rates t
         WHERE t.action = s.action AND t.reopens_at > cyclone.now()) AS rate_reopens_at,
       -- The pause that holds it, if any: its run's, else its workflow's, else its
       -- action's (75_pauses.sql).
       CASE WHEN r.paused_at IS NOT NULL
            THEN jsonb_build_object('kind', 'run', 'name', r.run_id, 'actor', r.paused_by,
                                    'reason', r.pause_reason, 'at', r.paused_at)
            ELSE (SELECT jsonb_build_object('kind', p.kind, 'name', p.name, 'actor', p.actor,
                                            'reason', p.reason, 'at', p.at)
                    FROM cyclone.pauses p
                   WHERE (p.kind = 'workflow' AND p.name = r.workflow)
                      OR (p.kind = 'action' AND p.name = s.action)
                   ORDER BY p.kind DESC LIMIT 1) END AS pause
  FROM cyclone.runs r
  LEFT JOIN cyclone.steps s ON s.run_id = r.run_id AND s.node = :node
  LEFT JOIN cyclone.action_claims a ON a.action = s.action
 WHERE r.run_id = CAST(:run_id AS uuid);

-- name: step_explain_counts
SELECT ready_ahead, action_running, key_running
  FROM cyclone.step_explain_counts(CAST(:run_id AS uuid), :node);

-- name: run_get
-- A run with its steps, their errors and the audit trail, read in one statement so
-- that the picture is consistent. With :node, only that node's step and errors.
SELECT r.run_id, r.workflow, r.status, r.input, r.error, r.submit_key, r.created_at,
       r.updated_at, r.finished_at,
       r.parent_run_id, r.parent_node, r.parent_step_id,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'node', s.node, 'action', s.action, 'status', s.status,
                   'attempt', s.attempt, 'max_attempts', s.max_attempts,
                   'depends_on', s.depends_on, 'trigger_rule', s.trigger_rule,
                   'input', s.input, 'output', s.output, 'progress', s.progress,
                   'worker_id', s.worker_id,
                   'lease_expires_at', CASE WHEN s.status = 'running' THEN s.lease_expires_at END,
                   'last_heartbeat_at', s.last_heartbeat_at,
                   'available_at', CASE WHEN s.status = 'available' THEN s.available_at END,
                   'started_at', s.started_at, 'finished_at', s.finished_at,
                   'effect_uncertain', s.effect_uncertain,
                   'timeout_s', extract(epoch FROM s.timeout),
                   'resumes', s.resumes, 'recoveries', s.recoveries,
                   'waiting_for', CASE WHEN s.status IN ('available', 'pending')
                                       THEN s.waiting_for END,
                   'priority', s.priority, 'concurrency_key', s.concurrency_key,
                   'concurrency_limit', s.concurrency_limit, 'build_id', s.build_id,
                   'attempt_budget', s.attempt_budget,
                   'initial_backoff_s', extract(epoch FROM s.initial_backoff),
                   'max_backoff_s', extract(epoch FROM s.max_backoff),
                   'backoff_multiplier', s.backoff_multiplier,
                   'unsafe', s.unsafe,
                   -- What it waits for with no worker: a durable wait ("sleep",
                   -- "event", "child"), its run's start time, a retry's backoff.
                   'waiting', CASE
                       WHEN s.waiting_for IS NOT NULL
                            AND (s.status = 'pending' OR (s.status = 'available'
                                                          AND s.available_at > cyclone.now()))
                           THEN split_part(s.waiting_for, ' ', 1)
                       WHEN s.status = 'available' AND s.available_at > cyclone.now()
                           THEN CASE WHEN s.attempt = 0 THEN 'start' ELSE 'backoff' END END,
                   -- A ready step whose action's rate limit is used up: until when (as
                   -- step_explain reads it; a full concurrency key GetRun counts apart).
                   'rate_reopens_at', CASE WHEN s.status = 'available' THEN (
                       SELECT t.reopens_at FROM cyclone.action_rates t
                        WHERE t.action = s.action AND t.reopens_at > cyclone.now()) END,
                   -- _step_call_json's shape, written out: on Citus the row is a
                   -- shard's, of another type.
                   'journal', (SELECT jsonb_agg(to_jsonb(j) - 'run_id' - 'node' ORDER BY j.seq)
                                 FROM cyclone.step_calls j
                                WHERE j.run_id = s.run_id AND j.node = s.node))
                   ORDER BY s.position), '[]')
          FROM cyclone.steps s
         WHERE s.run_id = r.run_id
           AND (CAST(:node AS text) IS NULL OR s.node = :node)) AS steps,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'node', e.node, 'attempt', e.attempt, 'kind', e.kind, 'type', e.type,
                   'message', e.message, 'details', e.details, 'retryable', e.retryable,
                   'at', e.at) ORDER BY e.at), '[]')
          FROM cyclone.step_errors e
         WHERE e.run_id = r.run_id
           AND (CAST(:node AS text) IS NULL OR e.node = :node)) AS errors,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'action', a.action, 'node', a.node, 'actor', a.actor, 'reason', a.reason,
                   'details', a.details, 'at', a.at) ORDER BY a.id), '[]')
          FROM cyclone.audit a WHERE a.run_id = r.run_id) AS audit,
       r.priority, r.start_at, r.paused_at, r.paused_by, r.pause_reason, r.tags, r.deadline
  FROM cyclone.runs r
 WHERE r.run_id = CAST(:run_id AS uuid);

-- name: runs_list
-- Newest first, keyset-paged on (created_at, run_id): the page after :after_created.
-- A run id prefix is a range of the primary key; a workflow prefix arrives as the
-- names it matches (runs_workflows); a key prefix is a LIKE pattern, which
-- runs_key_idx (text_pattern_ops) answers as a range whatever the database's collation.
-- With a tag filter: runs_list_tagged.
-- Planned at each call (service.db.pool.UNPREPARED), with the filters given.
SELECT r.run_id, r.workflow, r.status, r.input, r.error, r.submit_key, r.created_at,
       r.updated_at, r.finished_at,
       r.parent_run_id, r.parent_node, r.parent_step_id,
       (SELECT jsonb_object_agg(c.status, c.n)
          FROM (SELECT s.status, count(*) AS n FROM cyclone.steps s
                 WHERE s.run_id = r.run_id GROUP BY s.status) c) AS step_counts,
       r.start_at, r.paused_at, r.paused_by, r.pause_reason, r.tags, r.deadline
  FROM cyclone.runs r
 WHERE (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
   AND (CAST(:statuses AS text[]) IS NULL OR r.status = ANY (CAST(:statuses AS text[])))
   AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
   AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
   AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
   AND (CAST(:run_id_lo AS uuid) IS NULL
        OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
   AND (CAST(:workflows AS text[]) IS NULL OR r.workflow = ANY (CAST(:workflows AS text[])))
   AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
   AND (CAST(:after_created AS timestamptz) IS NULL
        OR (r.created_at, r.run_id) < (CAST(:after_created AS timestamptz),
                                       CAST(:after_run_id AS uuid)))
 ORDER BY r.created_at DESC, r.run_id DESC
 LIMIT :limit;

-- name: runs_list_newer
-- The page before a position (newer runs), oldest first: the caller reverses it.
SELECT r.run_id, r.workflow, r.status, r.input, r.error, r.submit_key, r.created_at,
       r.updated_at, r.finished_at,
       r.parent_run_id, r.parent_node, r.parent_step_id,
       (SELECT jsonb_object_agg(c.status, c.n)
          FROM (SELECT s.status, count(*) AS n FROM cyclone.steps s
                 WHERE s.run_id = r.run_id GROUP BY s.status) c) AS step_counts,
       r.start_at, r.paused_at, r.paused_by, r.pause_reason, r.tags, r.deadline
  FROM cyclone.runs r
 WHERE (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
   AND (CAST(:statuses AS text[]) IS NULL OR r.status = ANY (CAST(:statuses AS text[])))
   AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
   AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
   AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
   AND (CAST(:run_id_lo AS uuid) IS NULL
        OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
   AND (CAST(:workflows AS text[]) IS NULL OR r.workflow = ANY (CAST(:workflows AS text[])))
   AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
   AND (r.created_at, r.run_id) > (CAST(:after_created AS timestamptz),
                                   CAST(:after_run_id AS uuid))
 ORDER BY r.created_at, r.run_id
 LIMIT :limit;

-- name: runs_list_tagged
-- runs_list with a tag filter: run_tags_idx walked from the newest run carrying one tag
-- (:tag_key = :tag_value, the rarest of the filter's, see run_tag_size), each run read
-- by its key and kept when it carries every tag of the filter (:tags, a JSON object) and
-- passes the other filters, until the page is full. Keyset-paged on the same
-- (created_at, run_id) as runs_list.
SELECT r.run_id, r.workflow, r.status, r.input, r.error, r.submit_key, r.created_at,
       r.updated_at, r.finished_at,
       r.parent_run_id, r.parent_node, r.parent_step_id,
       (SELECT jsonb_object_agg(c.status, c.n)
          FROM (SELECT s.status, count(*) AS n FROM cyclone.steps s
                 WHERE s.run_id = r.run_id GROUP BY s.status) c) AS step_counts,
       r.start_at, r.paused_at, r.paused_by, r.pause_reason, r.tags, r.deadline
  FROM cyclone.run_tags t
  JOIN cyclone.runs r ON r.run_id = t.run_id
 WHERE t.key = :tag_key AND t.value = :tag_value AND r.tags @> CAST(:tags AS jsonb)
   AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
   AND (CAST(:statuses AS text[]) IS NULL OR r.status = ANY (CAST(:statuses AS text[])))
   AND (CAST(:created_after AS timestamptz) IS NULL OR t.created_at >= :created_after)
   AND (CAST(:created_before AS timestamptz) IS NULL OR t.created_at < :created_before)
   AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
   AND (CAST(:run_id_lo AS uuid) IS NULL
        OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
   AND (CAST(:workflows AS text[]) IS NULL OR r.workflow = ANY (CAST(:workflows AS text[])))
   AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
   AND (CAST(:after_created AS timestamptz) IS NULL
        OR (t.created_at, t.run_id) < (CAST(:after_created AS timestamptz),
                                       CAST(:after_run_id AS uuid)))
 ORDER BY t.created_at DESC, t.run_id DESC
 LIMIT :limit;

-- name: runs_list_tagged_newer
-- runs_list_newer with a tag filter, as runs_list_tagged.
SELECT r.run_id, r.workflow, r.status, r.input, r.error, r.submit_key, r.created_at,
       r.updated_at, r.finished_at,
       r.parent_run_id, r.parent_node, r.parent_step_id,
       (SELECT jsonb_object_agg(c.status, c.n)
          FROM (SELECT s.status, count(*) AS n FROM cyclone.steps s
                 WHERE s.run_id = r.run_id GROUP BY s.status) c) AS step_counts,
       r.start_at, r.paused_at, r.paused_by, r.pause_reason, r.tags, r.deadline
  FROM cyclone.run_tags t
  JOIN cyclone.runs r ON r.run_id = t.run_id
 WHERE t.key = :tag_key AND t.value = :tag_value AND r.tags @> CAST(:tags AS jsonb)
   AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
   AND (CAST(:statuses AS text[]) IS NULL OR r.status = ANY (CAST(:statuses AS text[])))
   AND (CAST(:created_after AS timestamptz) IS NULL OR t.created_at >= :created_after)
   AND (CAST(:created_before AS timestamptz) IS NULL OR t.created_at < :created_before)
   AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
   AND (CAST(:run_id_lo AS uuid) IS NULL
        OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
   AND (CAST(:workflows AS text[]) IS NULL OR r.workflow = ANY (CAST(:workflows AS text[])))
   AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
   AND (t.created_at, t.run_id) > (CAST(:after_created AS timestamptz),
                                   CAST(:after_run_id AS uuid))
 ORDER BY t.created_at, t.run_id
 LIMIT :limit;

-- name: run_tag_size
-- How many runs carry one tag, counted up to :cap (an index-only range of
-- run_tags_idx): the filter's rarest tag leads runs_list_tagged and runs_count_tagged.
SELECT count(*) AS n
  FROM (SELECT 1 FROM cyclone.run_tags t
         WHERE t.key = :tag_key AND t.value = :tag_value LIMIT :cap) c;

-- name: runs_workflows
-- The workflow names starting with :prefix, in order: a skip scan of
-- runs_workflow_created_idx, one index probe per distinct name (however many runs
-- each has), stopped by the LIMIT once enough names match.
WITH RECURSIVE w(name) AS (
    (SELECT r.workflow FROM cyclone.runs r ORDER BY r.workflow LIMIT 1)
    UNION ALL
    SELECT (SELECT r.workflow FROM cyclone.runs r
             WHERE r.workflow > w.name ORDER BY r.workflow LIMIT 1)
      FROM w WHERE w.name IS NOT NULL)
SELECT w.name FROM w
 WHERE w.name IS NOT NULL AND starts_with(w.name, :prefix)
 LIMIT :limit;

-- name: runs_count
-- CountRuns: per status asked, the runs matching the filters, counted up to :limit (the
-- caller asks for one more than it shows, to know when there are more). Each status is
-- its own branch so that the planner sees it as a constant and reads that status's
-- index (completed: runs_completed_created_idx; the others: runs_status_created_idx; a
-- key: runs_key_idx), at most :limit entries of it. With a tag filter: runs_count_tagged. The order (which a count does not
-- need) keeps the planner on an index walked from the newest, however many rows the
-- status has: without it, a LIMIT over a common status is planned as a sequential scan
-- that stops early, which reads the whole table when the matching rows are at its end.
-- Planned at each call (service.db.pool.UNPREPARED), with the filters given.
SELECT 'running' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.runs r
         WHERE r.status = 'running'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
           AND (CAST(:run_id_lo AS uuid) IS NULL
                OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
           AND (CAST(:workflows AS text[]) IS NULL
                OR r.workflow = ANY (CAST(:workflows AS text[])))
           AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'running' = ANY (CAST(:statuses AS text[]))
UNION ALL
SELECT 'completed' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.runs r
         WHERE r.status = 'completed'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
           AND (CAST(:run_id_lo AS uuid) IS NULL
                OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
           AND (CAST(:workflows AS text[]) IS NULL
                OR r.workflow = ANY (CAST(:workflows AS text[])))
           AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'completed' = ANY (CAST(:statuses AS text[]))
UNION ALL
SELECT 'failed' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.runs r
         WHERE r.status = 'failed'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
           AND (CAST(:run_id_lo AS uuid) IS NULL
                OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
           AND (CAST(:workflows AS text[]) IS NULL
                OR r.workflow = ANY (CAST(:workflows AS text[])))
           AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'failed' = ANY (CAST(:statuses AS text[]))
UNION ALL
SELECT 'blocked' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.runs r
         WHERE r.status = 'blocked'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
           AND (CAST(:run_id_lo AS uuid) IS NULL
                OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
           AND (CAST(:workflows AS text[]) IS NULL
                OR r.workflow = ANY (CAST(:workflows AS text[])))
           AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'blocked' = ANY (CAST(:statuses AS text[]))
UNION ALL
SELECT 'cancelled' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.runs r
         WHERE r.status = 'cancelled'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
           AND (CAST(:run_id_lo AS uuid) IS NULL
                OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
           AND (CAST(:workflows AS text[]) IS NULL
                OR r.workflow = ANY (CAST(:workflows AS text[])))
           AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'cancelled' = ANY (CAST(:statuses AS text[]));

-- name: runs_count_tagged
-- runs_count with a tag filter (:tags, led by :tag_key = :tag_value, the rarest, as in
-- runs_list_tagged): per status asked, up to :limit matching runs, in the runs' order
-- so that the planner may take either way in: the status's index from the newest run,
-- each run's tag looked up by its key (a common tag, or a rare status), or the tag's
-- range of run_tags_idx, each run read by its key, then sorted (a rare tag).
SELECT 'running' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.run_tags t JOIN cyclone.runs r ON r.run_id = t.run_id
         WHERE t.key = :tag_key AND t.value = :tag_value AND r.tags @> CAST(:tags AS jsonb)
           AND r.status = 'running'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
           AND (CAST(:run_id_lo AS uuid) IS NULL
                OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
           AND (CAST(:workflows AS text[]) IS NULL
                OR r.workflow = ANY (CAST(:workflows AS text[])))
           AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'running' = ANY (CAST(:statuses AS text[]))
UNION ALL
SELECT 'completed' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.run_tags t JOIN cyclone.runs r ON r.run_id = t.run_id
         WHERE t.key = :tag_key AND t.value = :tag_value AND r.tags @> CAST(:tags AS jsonb)
           AND r.status = 'completed'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
           AND (CAST(:run_id_lo AS uuid) IS NULL
                OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
           AND (CAST(:workflows AS text[]) IS NULL
                OR r.workflow = ANY (CAST(:workflows AS text[])))
           AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'completed' = ANY (CAST(:statuses AS text[]))
UNION ALL
SELECT 'failed' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.run_tags t JOIN cyclone.runs r ON r.run_id = t.run_id
         WHERE t.key = :tag_key AND t.value = :tag_value AND r.tags @> CAST(:tags AS jsonb)
           AND r.status = 'failed'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
           AND (CAST(:run_id_lo AS uuid) IS NULL
                OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
           AND (CAST(:workflows AS text[]) IS NULL
                OR r.workflow = ANY (CAST(:workflows AS text[])))
           AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'failed' = ANY (CAST(:statuses AS text[]))
UNION ALL
SELECT 'blocked' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.run_tags t JOIN cyclone.runs r ON r.run_id = t.run_id
         WHERE t.key = :tag_key AND t.value = :tag_value AND r.tags @> CAST(:tags AS jsonb)
           AND r.status = 'blocked'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
           AND (CAST(:run_id_lo AS uuid) IS NULL
                OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
           AND (CAST(:workflows AS text[]) IS NULL
                OR r.workflow = ANY (CAST(:workflows AS text[])))
           AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'blocked' = ANY (CAST(:statuses AS text[]))
UNION ALL
SELECT 'cancelled' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.run_tags t JOIN cyclone.runs r ON r.run_id = t.run_id
         WHERE t.key = :tag_key AND t.value = :tag_value AND r.tags @> CAST(:tags AS jsonb)
           AND r.status = 'cancelled'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
           AND (CAST(:run_id_lo AS uuid) IS NULL
                OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
           AND (CAST(:workflows AS text[]) IS NULL
                OR r.workflow = ANY (CAST(:workflows AS text[])))
           AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'cancelled' = ANY (CAST(:statuses AS text[]));

-- name: runs_count_tag_whole
-- CountRuns when the filter's rarest tag (:tag_key = :tag_value) is carried by fewer
-- runs than run_tag_size's cap: its range of run_tags_idx read once, each run read by
-- its key and counted by status (exact, whatever the limit), rather than a walk per
-- status.
SELECT r.status, count(*) AS n
  FROM cyclone.run_tags t
  JOIN cyclone.runs r ON r.run_id = t.run_id
 WHERE t.key = :tag_key AND t.value = :tag_value AND r.tags @> CAST(:tags AS jsonb)
   AND r.status = ANY (CAST(:statuses AS text[]))
   AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
   AND (CAST(:created_after AS timestamptz) IS NULL OR t.created_at >= :created_after)
   AND (CAST(:created_before AS timestamptz) IS NULL OR t.created_at < :created_before)
   AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
   AND (CAST(:run_id_lo AS uuid) IS NULL
        OR r.run_id BETWEEN CAST(:run_id_lo AS uuid) AND CAST(:run_id_hi AS uuid))
   AND (CAST(:workflows AS text[]) IS NULL OR r.workflow = ANY (CAST(:workflows AS text[])))
   AND (CAST(:key_like AS text) IS NULL OR r.submit_key LIKE :key_like)
 GROUP BY r.status;

-- name: step_logs_get
-- A run's log lines (GetRun with logs, `cyclone logs`): all its steps', or one node's,
-- or one attempt's, in order.
SELECT node, attempt, seq, at, level, logger, message
  FROM cyclone.step_logs
 WHERE run_id = CAST(:run_id AS uuid)
   AND (CAST(:node AS text) IS NULL OR node = :node)
   AND (CAST(:attempt AS integer) IS NULL OR attempt = :attempt)
 ORDER BY node, attempt, seq;

-- name: runs_errors
-- The errors of runs a claim blocked, for the claim's answer (ClaimResponse.blocked).
SELECT run_id, error FROM cyclone.runs WHERE run_id = ANY (CAST(:run_ids AS uuid[]));

-- name: keys_running
-- GetRun: the steps running under each of the concurrency keys given, through
-- steps_key_running_idx (one multi-shard read on Citus).
SELECT s.concurrency_key, count(*)::integer AS running
  FROM cyclone.steps s
 WHERE s.status = 'running' AND s.concurrency_key = ANY (CAST(:keys AS text[]))
 GROUP BY s.concurrency_key;
