-- Named queries of the server's db wing: workers (service/db/workers.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

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

-- name: workers_seen_note
-- What this server saw of the workers asking for work since its last report: per worker
-- the actions it serves (a JSON list each: arrays of arrays must be rectangular), its
-- build, how long ago. Newer facts win; rows are written in worker order, so two
-- reports cannot deadlock.
INSERT INTO cyclone.workers_seen AS w (worker_id, actions, build_id, seen_at)
SELECT a.worker_id,
       ARRAY(SELECT jsonb_array_elements_text(CAST(a.actions AS jsonb))),
       a.build_id, cyclone.now() - make_interval(secs => a.seen_ago)
  FROM unnest(CAST(:worker_ids AS text[]), CAST(:actions AS text[]),
              CAST(:build_ids AS text[]), CAST(:seen_ago AS float8[]))
       AS a(worker_id, actions, build_id, seen_ago)
 ORDER BY a.worker_id
    ON CONFLICT (worker_id) DO UPDATE
   SET actions = CASE WHEN excluded.seen_at >= w.seen_at THEN excluded.actions
                      ELSE w.actions END,
       build_id = CASE WHEN excluded.seen_at >= w.seen_at THEN excluded.build_id
                       ELSE w.build_id END,
       seen_at = greatest(w.seen_at, excluded.seen_at);

-- name: workers_seen_forget
-- The workers not seen asking for work for :forget_s are forgotten.
DELETE FROM cyclone.workers_seen w
 WHERE w.seen_at < cyclone.now() - make_interval(secs => :forget_s);

-- name: workers_seen_list
-- ListWorkers: the workers seen asking for work, latest first.
SELECT w.worker_id, w.actions, w.build_id, w.seen_at
  FROM cyclone.workers_seen w
 ORDER BY w.seen_at DESC
 LIMIT 1000;

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

-- name: workers_unhealthy
-- ListWorkers: the workers marked unhealthy (a lease of theirs lapsed), by worker_id.
SELECT h.worker_id, h.unhealthy_since, h.reason
  FROM cyclone.worker_health h
 ORDER BY h.worker_id
 LIMIT 1000;

-- name: worker_alive
-- A worker showed it is alive (a Claim, a message on its Work stream): it is no longer
-- unhealthy. Deletes nothing (and writes nothing) when it was not marked.
DELETE FROM cyclone.worker_health h WHERE h.worker_id = :worker_id
RETURNING h.worker_id;
