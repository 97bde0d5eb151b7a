-- Named queries of the server's db wing: schedules (service/db/schedules.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: clock_advance
-- Tests only: moves cyclone.now() forward.
UPDATE cyclone.clock SET offset_by = offset_by + make_interval(secs => :seconds);

-- name: clock_now
SELECT cyclone.now() AS now;

-- name: schedule_create
-- Nothing when a schedule has the name already.
INSERT INTO cyclone.schedules AS s (name, workflow, workflow_name, nodes, input, cron,
                                    time_zone, interval_s, overlap, catch_up, paused,
                                    next_fire_at, created_at, updated_at, tags)
VALUES (:schedule, CAST(:workflow AS jsonb), :workflow_name, CAST(:nodes AS jsonb),
        CAST(:input AS jsonb), :cron, :time_zone, :interval_s, :overlap, :catch_up, :paused,
        :next_fire_at, cyclone.now(), cyclone.now(), CAST(:tags AS jsonb))
    ON CONFLICT (name) DO NOTHING
RETURNING s.name, s.workflow, s.input, s.cron, s.time_zone, s.interval_s, s.overlap,
          s.catch_up, s.paused, s.next_fire_at, s.last_fire_at, s.last_run_id, s.created_at,
          s.updated_at, s.tags;

-- name: schedule_get
SELECT name, workflow, input, cron, time_zone, interval_s, overlap, catch_up, paused,
       next_fire_at, last_fire_at, last_run_id, created_at, updated_at, tags
  FROM cyclone.schedules
 WHERE name = :schedule;

-- name: schedules_list
-- In name order, after :after (the last name of the previous page).
SELECT name, workflow, input, cron, time_zone, interval_s, overlap, catch_up, paused,
       next_fire_at, last_fire_at, last_run_id, created_at, updated_at, tags
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
          s.updated_at, s.tags;

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
          s.updated_at, s.tags;

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
