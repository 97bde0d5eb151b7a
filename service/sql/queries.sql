-- Named queries of the Cyclone server. Each block starts with "-- name: <name>" and is
-- loaded by service.store; parameters are bound (:name), never formatted in.
-- Transitions are functions (service/schema/); these are their calls and the reads.

-- Transitions also return `ready`: the actions they made claimable (see
-- _notify_ready in service/schema/10_internals.sql), read in the same statement.

-- name: run_submit
SELECT run_id, created, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.run_submit(CAST(:run_id AS uuid), :workflow, :submit_key,
                          CAST(:input AS jsonb), CAST(:nodes AS jsonb),
                          CAST(:start_at AS timestamptz), :priority);

-- name: step_claim
-- The ids as text: the server hands them to workers as they are (service/wire.py), and
-- text costs the driver less than a uuid.UUID. The run's input and the upstream
-- outputs as JSON text too: service/wire.py parses each distinct one once per claim.
SELECT c.run_id::text AS run_id, c.node, c.action, c.workflow, c.attempt, c.max_attempts,
       c.input, c.run_input::text AS run_input, c.upstream::text AS upstream,
       c.lease_token::text AS lease_token,
       c.lease_expires_at, c.deadline_at, c.progress, c.effect_uncertain, c.blocked,
       c.waited_s, c.upstream_failures, c.journal
  FROM cyclone.step_claim(:worker_id, CAST(:actions AS text[]), CAST(:unsafe AS text[]),
                          :limit, make_interval(secs => :lease_s),
                          CAST(:rate_actions AS text[]), CAST(:rate_counts AS integer[]),
                          ARRAY(SELECT make_interval(secs => p)
                                  FROM unnest(CAST(:rate_periods AS float8[]))
                                       WITH ORDINALITY AS u(p, i) ORDER BY u.i)) c;

-- name: step_candidates_sharded
SELECT run_id, node, action, shard, concurrency_key, concurrency_limit, flow
  FROM cyclone.step_candidates_sharded(
           CAST(:actions AS text[]), :limit, CAST(:rate_actions AS text[]),
           CAST(:rate_counts AS integer[]),
           ARRAY(SELECT make_interval(secs => p)
                   FROM unnest(CAST(:rate_periods AS float8[])) WITH ORDINALITY AS u(p, i)
                  ORDER BY u.i));

-- name: step_claim_run
-- The columns of step_claim, ids as text.
SELECT c.run_id::text AS run_id, c.node, c.action, c.workflow, c.attempt, c.max_attempts,
       c.input, c.run_input::text AS run_input, c.upstream::text AS upstream,
       c.lease_token::text AS lease_token,
       c.lease_expires_at, c.deadline_at, c.progress, c.effect_uncertain, c.blocked,
       c.waited_s, c.upstream_failures, c.journal
  FROM cyclone.step_claim_run(CAST(:run_id AS uuid), CAST(:nodes AS text[]), :worker_id,
                              CAST(:unsafe AS text[]), make_interval(secs => :lease_s)) c;

-- name: step_claim_shard
-- Delegated whole to the node of :run_id's shard (a call outside a transaction block).
-- The columns of step_claim, ids as text.
SELECT c.run_id::text AS run_id, c.node, c.action, c.workflow, c.attempt, c.max_attempts,
       c.input, c.run_input::text AS run_input, c.upstream::text AS upstream,
       c.lease_token::text AS lease_token,
       c.lease_expires_at, c.deadline_at, c.progress, c.effect_uncertain, c.blocked,
       c.waited_s, c.upstream_failures, c.journal
  FROM cyclone.step_claim_shard(CAST(:run_id AS uuid), CAST(:runs AS uuid[]),
                                CAST(:nodes AS text[]), :worker_id, CAST(:unsafe AS text[]),
                                make_interval(secs => :lease_s)) c;

-- name: step_claim_flow
-- The columns of step_claim, ids as text.
SELECT c.run_id::text AS run_id, c.node, c.action, c.workflow, c.attempt, c.max_attempts,
       c.input, c.run_input::text AS run_input, c.upstream::text AS upstream,
       c.lease_token::text AS lease_token,
       c.lease_expires_at, c.deadline_at, c.progress, c.effect_uncertain, c.blocked,
       c.waited_s, c.upstream_failures, c.journal
  FROM cyclone.step_claim_flow(CAST(:runs AS uuid[]), CAST(:nodes AS text[]),
                               CAST(:actions AS text[]), CAST(:keys AS text[]),
                               CAST(:limits AS integer[]), :worker_id, CAST(:unsafe AS text[]),
                               make_interval(secs => :lease_s), :limit,
                               CAST(:rate_actions AS text[]), CAST(:rate_counts AS integer[]),
                               ARRAY(SELECT make_interval(secs => p)
                                       FROM unnest(CAST(:rate_periods AS float8[]))
                                            WITH ORDINALITY AS u(p, i) ORDER BY u.i)) c;

-- name: step_next_due_sharded
SELECT cyclone.step_next_due_sharded(CAST(:actions AS text[])) AS seconds;

-- name: runs_purge_sharded
SELECT cyclone.runs_purge_sharded(make_interval(secs => :age_s), :failed, :limit) AS deleted;

-- name: submit_keys_purge_sharded
SELECT cyclone.submit_keys_purge_sharded(make_interval(secs => :age_s), :limit) AS deleted;

-- name: sharded
SELECT cyclone.sharded() AS sharded;

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
-- Seconds until a claim of these actions may find work: a backoff or start time
-- coming due, a rate limit's window opening, or a concurrency key to look at again.
SELECT cyclone.step_next_due(CAST(:actions AS text[])) AS seconds;

-- name: step_attempt
-- A step's attempt, for a log line about an outcome this server did not hand out.
SELECT attempt FROM cyclone.steps WHERE run_id = CAST(:run_id AS uuid) AND node = :node;

-- name: step_heartbeat
SELECT lease_expires_at, cancelled
  FROM cyclone.step_heartbeat(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid),
                              make_interval(secs => :lease_s), CAST(:progress AS jsonb));

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
                               :step_id, :seq, :function, :unsafe);

-- name: step_call_end
-- The server's path: a repeat answers duplicate = true, where the public
-- cyclone.step_call_record (a worker's own transaction) raises CY005. A safe call's end
-- is committed without waiting for its WAL flush: losing it only runs a safe call
-- again, and the node's Complete, durable, flushes it first.
SELECT e.duplicate, e.call
  FROM cyclone._step_call_end(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid),
                              :step_id, :seq, :function, :unsafe, CAST(:output AS jsonb),
                              CAST(:error AS jsonb)) e
 CROSS JOIN LATERAL (SELECT set_config('synchronous_commit',
                                       CASE WHEN :unsafe THEN 'on' ELSE 'off' END,
                                       true)) c;

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

-- name: child_start
SELECT child_run_id, created, call, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.child_start(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid), :step_id,
                           :seq, CAST(:child_run_id AS uuid), :workflow,
                           CAST(:input AS jsonb), CAST(:nodes AS jsonb));

-- name: run_cancel
-- With the actions it made claimable (a parent's node waiting for a child cancelled
-- here is woken), as the transitions' queries return them.
SELECT c.run_cancel, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.run_cancel(CAST(:run_id AS uuid), :actor, :reason, :keep_children) AS c(run_cancel);

-- name: releases_pending
-- The runs with a release in progress (cyclone.releases), oldest first.
SELECT p.run_id FROM cyclone.releases_pending(:limit) AS p(run_id);

-- name: release_continue
-- The next chunk of a run's release in progress; more: whether any is left.
SELECT more, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.release_continue(CAST(:run_id AS uuid)) AS more;

-- name: sweep
-- One row per expired lease reclaimed: run_id, node, action, attempt, worker_id, and
-- the status the step was left in (available, or discarded when out of attempts).
SELECT s.run_id, s.node, s.action, s.attempt, s.worker_id, s.status,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.sweep_steps(:limit) s;

-- name: runs_purge
-- Retention: deletes up to :limit runs finished more than :age_s seconds ago, failed
-- ones when :failed, else completed and cancelled ones.
SELECT cyclone.runs_purge(make_interval(secs => :age_s), :failed, :limit) AS deleted;

-- name: submit_keys_purge
-- Retention of SubmitOnce keys: deletes up to :limit keys older than :age_s seconds
-- whose run is gone.
SELECT cyclone.submit_keys_purge(make_interval(secs => :age_s), :limit) AS deleted;

-- name: action_claims_note
-- What this server saw of workers since its last report: per action, how long ago a
-- Claim last named it and by whom, and how long ago one last got a step of it (NULL:
-- not since). Newer facts win, so servers reporting at once do not undo each other;
-- rows are written in action order, so two reports cannot deadlock.
INSERT INTO cyclone.action_claims AS c (action, polled_at, polled_by, claimed_at, claimed_by)
SELECT a.action, cyclone.now() - make_interval(secs => a.polled_ago), a.polled_by,
       cyclone.now() - make_interval(secs => a.claimed_ago), a.claimed_by
  FROM unnest(CAST(:actions AS text[]), CAST(:polled_ago AS float8[]),
              CAST(:polled_by AS text[]), CAST(:claimed_ago AS float8[]),
              CAST(:claimed_by AS text[]))
       AS a(action, polled_ago, polled_by, claimed_ago, claimed_by)
 ORDER BY a.action
    ON CONFLICT (action) DO UPDATE
   SET polled_at = greatest(c.polled_at, excluded.polled_at),
       polled_by = CASE WHEN excluded.polled_at >= c.polled_at THEN excluded.polled_by
                        ELSE c.polled_by END,
       claimed_at = greatest(c.claimed_at, excluded.claimed_at),
       claimed_by = CASE WHEN excluded.claimed_at >= c.claimed_at OR c.claimed_at IS NULL
                         THEN coalesce(excluded.claimed_by, c.claimed_by)
                         ELSE c.claimed_by END;

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
       r.run_id, s.waiting_for, s.resumes,
       s.concurrency_key, s.concurrency_limit, NULL::bigint AS key_running,
       -- When its action's rate limit opens again, if it is used up now.
       (SELECT t.reopens_at FROM cyclone.action_rates t
         WHERE t.action = s.action AND t.reopens_at > cyclone.now()) AS rate_reopens_at
  FROM cyclone.runs r
  LEFT JOIN cyclone.steps s ON s.run_id = r.run_id AND s.node = :node
  LEFT JOIN cyclone.action_claims a ON a.action = s.action
 WHERE r.run_id = CAST(:run_id AS uuid);

-- name: step_explain_counts
SELECT ready_ahead, action_running, key_running
  FROM cyclone.step_explain_counts(CAST(:run_id AS uuid), :node);

-- name: metrics_gauges
-- The gauges read from the database at a scrape: runs by status (completed runs are
-- not counted: that would read the whole table; count completions with the
-- cyclone_runs_finished_total counter), and per action the ready steps (with the age
-- of the oldest), those waiting out a backoff, the running ones and the running ones
-- whose lease expired without the sweep reclaiming them yet. Each part reads a
-- partial index.
SELECT 'runs' AS part, status AS label, count(*) AS n, NULL::float8 AS age_s, 0 AS extra
  FROM cyclone.runs WHERE status <> 'completed' GROUP BY status
UNION ALL
SELECT 'available', action,
       count(*) FILTER (WHERE available_at <= cyclone.now()),
       extract(epoch FROM cyclone.now()
                          - min(available_at) FILTER (WHERE available_at <= cyclone.now())),
       count(*) FILTER (WHERE available_at > cyclone.now())
  FROM cyclone.steps WHERE status = 'available' GROUP BY action
UNION ALL
SELECT 'running', action, count(*), NULL,
       count(*) FILTER (WHERE lease_expires_at <= cyclone.now())
  FROM cyclone.steps WHERE status = 'running' AND lease_expires_at IS NOT NULL GROUP BY action;

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
                   'resumes', s.resumes,
                   'waiting_for', CASE WHEN s.status IN ('available', 'pending')
                                       THEN s.waiting_for END,
                   'priority', s.priority, 'concurrency_key', s.concurrency_key,
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
       r.priority, r.start_at
  FROM cyclone.runs r
 WHERE r.run_id = CAST(:run_id AS uuid);

-- name: runs_list
-- Newest first, keyset-paged on (created_at, run_id).
SELECT r.run_id, r.workflow, r.status, r.input, r.error, r.submit_key, r.created_at,
       r.updated_at, r.finished_at,
       r.parent_run_id, r.parent_node, r.parent_step_id,
       (SELECT jsonb_object_agg(c.status, c.n)
          FROM (SELECT s.status, count(*) AS n FROM cyclone.steps s
                 WHERE s.run_id = r.run_id GROUP BY s.status) c) AS step_counts
  FROM cyclone.runs r
 WHERE (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
   AND (CAST(:statuses AS text[]) IS NULL OR r.status = ANY (CAST(:statuses AS text[])))
   AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
   AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
   AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
   AND (CAST(:after_created AS timestamptz) IS NULL
        OR (r.created_at, r.run_id) < (CAST(:after_created AS timestamptz),
                                       CAST(:after_run_id AS uuid)))
 ORDER BY r.created_at DESC, r.run_id DESC
 LIMIT :limit;

-- name: runs_count
-- CountRuns: per status asked, the runs matching the filters, counted up to :limit (the
-- caller asks for one more than it shows, to know when there are more). Each status is
-- its own branch so that the planner sees it as a constant and reads that status's
-- index (completed: runs_completed_created_idx; the others: runs_status_created_idx; a
-- key: runs_key_idx), at most :limit entries of it. The order (which a count does not
-- need) keeps the planner on an index walked from the newest, however many rows the
-- status has: without it, a LIMIT over a common status is planned as a sequential scan
-- that stops early, which reads the whole table when the matching rows are at its end.
-- Planned at each call (service.store.UNPREPARED), with the filters given.
SELECT 'running' AS status, (
    SELECT count(*) FROM (
        SELECT 1 FROM cyclone.runs r
         WHERE r.status = 'running'
           AND (CAST(:workflow AS text) IS NULL OR r.workflow = :workflow)
           AND (CAST(:created_after AS timestamptz) IS NULL OR r.created_at >= :created_after)
           AND (CAST(:created_before AS timestamptz) IS NULL OR r.created_at < :created_before)
           AND (CAST(:key AS text) IS NULL OR r.submit_key = :key)
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
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT :limit) c) AS n
 WHERE 'cancelled' = ANY (CAST(:statuses AS text[]));

-- name: steps_list
-- ListSteps: running steps by lease expiry (:kind 'running'; with :lease_expired only
-- those whose lease ran out), or steps backing off by due time (:kind 'backing_off'),
-- keyset-paged on (time, run_id, node). The running ones are read through
-- steps_leased_idx (every running step: as many as the workers hold), the backing-off
-- ones through steps_backoff_idx; each page's steps and runs then by key. Planned at
-- each call (service.store.UNPREPARED).
SELECT k.at, k.run_id,
       (SELECT r.workflow FROM cyclone.runs r WHERE r.run_id = k.run_id) AS workflow,
       jsonb_build_object(
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
           'resumes', s.resumes, 'waiting_for', NULL,
           'priority', s.priority, 'concurrency_key', s.concurrency_key) AS step,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'node', e.node, 'attempt', e.attempt, 'kind', e.kind, 'type', e.type,
                   'message', e.message, 'details', e.details, 'retryable', e.retryable,
                   'at', e.at) ORDER BY e.at), '[]')
          FROM cyclone.step_errors e
         WHERE e.run_id = s.run_id AND e.node = s.node) AS errors
  FROM (SELECT q.run_id, q.node, q.at
          FROM (SELECT s.run_id, s.node, s.lease_expires_at AS at
                  FROM cyclone.steps s
                 WHERE :kind = 'running' AND s.status = 'running'
                   AND s.lease_expires_at IS NOT NULL
                   AND (NOT :lease_expired OR s.lease_expires_at <= cyclone.now())
                   AND (CAST(:worker_id AS text) IS NULL OR s.worker_id = :worker_id)
                   AND (CAST(:action AS text) IS NULL OR s.action = :action)
                UNION ALL
                SELECT s.run_id, s.node, s.available_at
                  FROM cyclone.steps s
                 WHERE :kind = 'backing_off' AND s.status = 'available' AND s.attempt > 0
                   AND s.waiting_for IS NULL AND s.available_at > cyclone.now()
                   AND (CAST(:worker_id AS text) IS NULL OR s.worker_id = :worker_id)
                   AND (CAST(:action AS text) IS NULL OR s.action = :action)) q
         WHERE CAST(:after_at AS timestamptz) IS NULL
            OR (q.at, q.run_id, q.node) > (CAST(:after_at AS timestamptz),
                                           CAST(:after_run_id AS uuid), :after_node)
         ORDER BY q.at, q.run_id, q.node
         LIMIT :limit) k
  -- Each step of the page by its key (a lateral lookup, never a join the planner
  -- could hash over a scan of steps), its run's workflow likewise.
 CROSS JOIN LATERAL (SELECT * FROM cyclone.steps t
                      WHERE t.run_id = k.run_id AND t.node = k.node LIMIT 1) s
 ORDER BY k.at, k.run_id, k.node;

-- name: workers_running
-- ListWorkers: the running steps by worker and action (read through steps_leased_idx:
-- every running step, as many as the workers hold).
SELECT coalesce(s.worker_id, '') AS worker_id, s.action, count(*) AS running,
       max(s.last_heartbeat_at) AS last_heartbeat_at,
       count(*) FILTER (WHERE s.lease_expires_at <= cyclone.now()) AS lease_expired
  FROM cyclone.steps s
 WHERE s.status = 'running' AND s.lease_expires_at IS NOT NULL
 GROUP BY 1, 2
 ORDER BY 1, 2;

-- name: actions_activity
-- ListWorkers: every action a Claim ever named or a step waits to run, with the last
-- poll and claim and by whom (NULL polled_at: no Claim ever named it), and its ready
-- steps (counted up to 10,000). The actions of the available steps are found by
-- skipping through steps_ready_idx, one probe per action.
WITH RECURSIVE waiting(action) AS (
    (SELECT s.action FROM cyclone.steps s WHERE s.status = 'available'
      ORDER BY s.action LIMIT 1)
    UNION ALL
    SELECT (SELECT s.action FROM cyclone.steps s
             WHERE s.status = 'available' AND s.action > w.action
             ORDER BY s.action LIMIT 1)
      FROM waiting w
     WHERE w.action IS NOT NULL)
SELECT n.action, a.polled_at, a.polled_by, a.claimed_at, a.claimed_by,
       (SELECT count(*) FROM (
            SELECT 1 FROM cyclone.steps q
             WHERE q.status = 'available' AND q.action = n.action
               AND q.available_at <= cyclone.now()
             LIMIT 10000) x) AS ready_count
  FROM (SELECT w.action FROM waiting w WHERE w.action IS NOT NULL
        UNION
        SELECT c.action FROM cyclone.action_claims c) n
  LEFT JOIN cyclone.action_claims a ON a.action = n.action
 ORDER BY n.action
 LIMIT 1000;

-- name: clock_advance
-- Tests only: moves cyclone.now() forward.
UPDATE cyclone.clock SET offset_by = offset_by + make_interval(secs => :seconds);

-- name: step_report_many
-- CompleteMany: step calls ended, step calls begun, then the completions, in one
-- transaction. A batch of safe step calls' ends alone is committed without waiting for
-- its WAL flush (durable = false), as EndStepCall commits a safe call's end; anything
-- else (an unsafe call's begin or end, a completion) waits for it.
SELECT m.kind, m.i, m.step_status, m.run_status, m.duplicate, m.retry_at, m.decision,
       m.call, m.error_state, m.error_message, m.error_detail,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.step_report_many(CAST(:ends AS jsonb), CAST(:begins AS jsonb),
                                CAST(:items AS jsonb), :brief) m
 CROSS JOIN LATERAL (SELECT set_config('synchronous_commit',
                                       CASE WHEN :durable THEN 'on' ELSE 'off' END,
                                       true)) c;

-- Schedules (service/schema/85_schedules.sql) ------------------------------------

-- name: clock_now
SELECT cyclone.now() AS now;

-- name: schedule_create
-- Nothing when a schedule has the name already.
INSERT INTO cyclone.schedules AS s (name, workflow, workflow_name, nodes, input, cron,
                                    time_zone, interval_s, overlap, catch_up, paused,
                                    next_fire_at, created_at, updated_at)
VALUES (:schedule, CAST(:workflow AS jsonb), :workflow_name, CAST(:nodes AS jsonb),
        CAST(:input AS jsonb), :cron, :time_zone, :interval_s, :overlap, :catch_up, :paused,
        :next_fire_at, cyclone.now(), cyclone.now())
    ON CONFLICT (name) DO NOTHING
RETURNING s.name, s.workflow, s.input, s.cron, s.time_zone, s.interval_s, s.overlap,
          s.catch_up, s.paused, s.next_fire_at, s.last_fire_at, s.last_run_id, s.created_at,
          s.updated_at;

-- name: schedule_get
SELECT name, workflow, input, cron, time_zone, interval_s, overlap, catch_up, paused,
       next_fire_at, last_fire_at, last_run_id, created_at, updated_at
  FROM cyclone.schedules
 WHERE name = :schedule;

-- name: schedules_list
-- In name order, after :after (the last name of the previous page).
SELECT name, workflow, input, cron, time_zone, interval_s, overlap, catch_up, paused,
       next_fire_at, last_fire_at, last_run_id, created_at, updated_at
  FROM cyclone.schedules
 WHERE CAST(:after AS text) IS NULL OR name > :after
 ORDER BY name
 LIMIT :limit;

-- name: schedule_pause
-- (The time is read in FROM: Citus takes no STABLE function inside a CASE of an UPDATE.)
UPDATE cyclone.schedules AS s
   SET paused = true,
       updated_at = CASE WHEN s.paused THEN s.updated_at ELSE t.now END
  FROM (SELECT cyclone.now() AS now) t
 WHERE s.name = :schedule
RETURNING s.name, s.workflow, s.input, s.cron, s.time_zone, s.interval_s, s.overlap,
          s.catch_up, s.paused, s.next_fire_at, s.last_fire_at, s.last_run_id, s.created_at,
          s.updated_at;

-- name: schedule_resume
-- A paused schedule fires next at :next_fire_at (its first fire time after now); one
-- that is not paused is left as it is.
UPDATE cyclone.schedules AS s
   SET paused = false,
       next_fire_at = CASE WHEN s.paused THEN :next_fire_at ELSE s.next_fire_at END,
       updated_at = CASE WHEN s.paused THEN t.now ELSE s.updated_at END
  FROM (SELECT cyclone.now() AS now) t
 WHERE s.name = :schedule
RETURNING s.name, s.workflow, s.input, s.cron, s.time_zone, s.interval_s, s.overlap,
          s.catch_up, s.paused, s.next_fire_at, s.last_fire_at, s.last_run_id, s.created_at,
          s.updated_at;

-- name: schedule_delete
DELETE FROM cyclone.schedules WHERE name = :schedule RETURNING name;

-- name: schedules_turn
-- On a sharded database (Citus) the firing transaction's first statement. There,
-- schedules is a reference table, and Citus locks the whole table (every copy) for a
-- row lock or an update of one of its rows, until commit: SKIP LOCKED cannot pass by
-- the one schedule another server is firing, a pass would wait for that server's. So
-- servers take turns instead, without waiting: a pass that does not get this lock (on
-- the coordinator, until its commit) fires nothing, and the next one tries again.
SELECT pg_try_advisory_xact_lock(1668, 0) AS turn;

-- name: schedules_due
-- The firing transaction's first statement: due schedules, locked; those another
-- server is firing are skipped, not waited for. The workflow and input only of one
-- whose keys are still templates (nodes_keyed), for the pass to evaluate them.
SELECT cyclone.now() AS now, name, cron, time_zone, interval_s, catch_up, next_fire_at,
       nodes_keyed,
       CASE WHEN nodes_keyed THEN NULL ELSE workflow END AS workflow,
       CASE WHEN nodes_keyed THEN NULL ELSE input END AS input
  FROM cyclone.schedules
 WHERE NOT paused AND next_fire_at <= cyclone.now()
 ORDER BY next_fire_at
 LIMIT :limit
   FOR UPDATE SKIP LOCKED;

-- name: schedule_nodes_keyed
-- A locked schedule's nodes with their keys evaluated, in place of the templates.
UPDATE cyclone.schedules
   SET nodes = CAST(:nodes AS jsonb), nodes_keyed = true
 WHERE name = :schedule;

-- name: schedule_fire
SELECT fire_at, submit_key, run_id, outcome
  FROM cyclone.schedule_fire(:schedule, CAST(:fire_times AS timestamptz[]),
                             CAST(:run_ids AS uuid[]), :next_fire_at);

-- name: ready_actions
SELECT current_setting('cyclone.ready', true) AS ready;

-- name: step_logs_add
-- Log lines of held steps, in the transaction of their Heartbeat or completion, before
-- it (cyclone.step_logs_add, service/schema/55_step_logs.sql).
SELECT cyclone.step_logs_add(CAST(:items AS jsonb)) AS kept;

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
