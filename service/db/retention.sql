-- Named queries of the server's db wing: retention (service/db/retention.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: releases_pending
-- The runs with a release in progress (cyclone.releases), oldest first.
SELECT p.run_id FROM cyclone.releases_pending(:limit) AS p(run_id);

-- name: release_continue
-- The next chunk of a run's release in progress; more: whether any is left.
SELECT more, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.release_continue(CAST(:run_id AS uuid)) AS more;

-- name: sweep
-- One row per expired lease reclaimed: run_id, node, action, attempt, worker_id, the
-- status the step was left in (available, or discarded when out of attempts or past
-- the recovery budget :max_recoveries) and whether its worker was lost (the lease
-- lapsed before the step's deadline).
SELECT s.run_id, s.node, s.action, s.attempt, s.worker_id, s.status, s.lost,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.sweep_steps(:limit, :max_recoveries) s;

-- name: runs_purge
-- Retention: deletes up to :limit runs finished more than :age_s seconds ago, failed
-- ones when :failed, else completed and cancelled ones.
SELECT cyclone.runs_purge(make_interval(secs => :age_s), :failed, :limit) AS deleted;

-- name: submit_keys_purge
-- Retention of SubmitOnce keys: deletes up to :limit keys older than :age_s seconds
-- whose run is gone.
SELECT cyclone.submit_keys_purge(make_interval(secs => :age_s), :limit) AS deleted;

-- name: runs_purge_sharded
SELECT cyclone.runs_purge_sharded(make_interval(secs => :age_s), :failed, :limit) AS deleted;

-- name: submit_keys_purge_sharded
SELECT cyclone.submit_keys_purge_sharded(make_interval(secs => :age_s), :limit) AS deleted;

-- name: run_deadlines_fire
-- Cancels up to :limit running runs whose deadline has passed (each once, whatever
-- other servers fire at the same time); one row per run cancelled.
SELECT f.run_id, f.deadline, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.run_deadlines_fire(:limit) f;
