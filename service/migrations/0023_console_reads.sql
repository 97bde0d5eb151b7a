-- The console's reads at any size: CountRuns, ListRuns' key filter and
-- ListSteps reach their rows through indexes, never by a scan of runs or steps.
--
--   runs_completed_created_idx  the completed runs, newest first: CountRuns counts them
--                               (up to its limit) by reading this index only; the other
--                               statuses are in runs_status_created_idx already. Costs
--                               one index entry per completed run.
--   runs_key_idx                replaces runs_workflow_key_idx (which no query used):
--                               leading with the key, it serves a key filter with or
--                               without a workflow.
--   steps_backoff_idx           the steps backing off after a failed or lost attempt
--                               (ListSteps backing_off); a failure puts a step in it,
--                               its next claim takes it out, so it stays small.
--
-- Each CREATE INDEX holds writes to its table while it builds (seconds per million
-- rows).

CREATE INDEX runs_completed_created_idx ON cyclone.runs (created_at DESC, run_id DESC)
    WHERE status = 'completed';
DROP INDEX cyclone.runs_workflow_key_idx;
CREATE INDEX runs_key_idx ON cyclone.runs (submit_key, workflow)
    WHERE submit_key IS NOT NULL;
CREATE INDEX steps_backoff_idx ON cyclone.steps (available_at)
    WHERE status = 'available' AND attempt > 0 AND waiting_for IS NULL;
