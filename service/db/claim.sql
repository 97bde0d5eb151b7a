-- Named queries of the server's db wing: claim (service/db/claim.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: step_claim
-- The ids as text: the server hands them to workers as they are (service/wire.py), and
-- text costs the driver less than a uuid.UUID. The run's input and the upstream
-- outputs as JSON text too: service/wire.py parses each distinct one once per claim.
SELECT c.run_id::text AS run_id, c.node, c.action, c.workflow, c.attempt, c.max_attempts,
       c.input, c.run_input::text AS run_input, c.upstream::text AS upstream,
       c.lease_token::text AS lease_token,
       c.lease_expires_at, c.deadline_at, c.progress, c.effect_uncertain, c.blocked,
       c.waited_s, c.upstream_failures, c.journal, c.run_deadline, c.traceparent
  FROM cyclone.step_claim(:worker_id, CAST(:actions AS text[]), CAST(:unsafe AS text[]),
                          :limit, make_interval(secs => :lease_s),
                          CAST(:rate_actions AS text[]), CAST(:rate_counts AS integer[]),
                          ARRAY(SELECT make_interval(secs => p)
                                  FROM unnest(CAST(:rate_periods AS float8[]))
                                       WITH ORDINALITY AS u(p, i) ORDER BY u.i),
                          CAST(:build_id AS text)) c;

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
-- coming due (since the claim made :since seconds ago), a rate limit's window opening,
-- or a concurrency key to look at again.
SELECT cyclone.step_next_due(CAST(:actions AS text[]), CAST(:since AS float8)) AS seconds;

-- name: step_attempt
-- A step's attempt, for a log line about an outcome this server did not hand out.
SELECT attempt FROM cyclone.steps WHERE run_id = CAST(:run_id AS uuid) AND node = :node;

-- name: step_heartbeat
SELECT lease_expires_at, cancelled
  FROM cyclone.step_heartbeat(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid),
                              make_interval(secs => :lease_s), CAST(:progress AS jsonb));

-- name: steps_list
-- ListSteps: running steps by lease expiry (:kind 'running'; with :lease_expired only
-- those whose lease ran out), steps backing off by due time (:kind 'backing_off'), or
-- the ready steps of one action, longest ready first (:kind 'ready'), keyset-paged on
-- (time, run_id, node). The running ones are read through steps_leased_idx (every
-- running step: as many as the workers hold), the backing-off ones through
-- steps_backoff_idx, the ready ones through steps_ready_idx (that action's part); each
-- page's steps and runs then by key. Planned at each call (service.db.pool.UNPREPARED).
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
           'resumes', s.resumes, 'recoveries', s.recoveries, 'waiting_for', NULL,
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
                   AND (CAST(:action AS text) IS NULL OR s.action = :action)
                UNION ALL
                SELECT s.run_id, s.node, s.available_at
                  FROM cyclone.steps s
                 WHERE :kind = 'ready' AND s.status = 'available' AND s.action = :action
                   AND s.available_at <= cyclone.now()
                   AND (CAST(:worker_id AS text) IS NULL OR s.worker_id = :worker_id)) q
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

-- name: step_next_due_sharded
SELECT cyclone.step_next_due_sharded(CAST(:actions AS text[]), CAST(:since AS float8)) AS seconds;
