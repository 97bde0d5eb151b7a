-- The CHECK constraints of runs and steps, the same rules in three constraints instead
-- of fifteen (docs/performance.md, "The engine's SQL"). PostgreSQL reads each CHECK
-- expression again from its stored node text in every statement that writes the
-- table, and evaluates each one per row: on the claim, the completion and the run's
-- close, that was about 21,000 instructions per step. The merged constraints allow
-- exactly the rows the old ones allowed, their lists written as array constants
-- (shorter node text than IN lists or a CASE by status). Adding them checks every row
-- of runs and steps.
ALTER TABLE cyclone.runs
    DROP CONSTRAINT runs_status_known,
    DROP CONSTRAINT runs_finished_at_iff_finished,
    DROP CONSTRAINT runs_error_iff_failed_or_blocked,
    DROP CONSTRAINT runs_steps_open_in_range,
    DROP CONSTRAINT runs_open_iff_unfinished,
    ADD CONSTRAINT runs_status_valid CHECK (
        status = ANY ('{running,completed,failed,blocked,cancelled}'::text[])
        AND (finished_at IS NOT NULL) = (status = ANY ('{completed,failed,cancelled}'::text[]))
        AND (error IS NOT NULL) = (status = ANY ('{failed,blocked}'::text[]))
        AND (steps_open = 0) = (finished_at IS NOT NULL)
        AND steps_open >= 0 AND steps_open <= steps_total);

ALTER TABLE cyclone.steps
    DROP CONSTRAINT steps_status_known,
    DROP CONSTRAINT steps_trigger_rule_known,
    DROP CONSTRAINT steps_finished_at_iff_final,
    DROP CONSTRAINT steps_available_has_time,
    DROP CONSTRAINT steps_running_has_lease,
    DROP CONSTRAINT steps_deps_in_range,
    DROP CONSTRAINT steps_attempts_in_range,
    DROP CONSTRAINT steps_output_only_completed,
    DROP CONSTRAINT steps_attempt_budget_positive,
    DROP CONSTRAINT steps_resumes_in_range,
    ADD CONSTRAINT steps_status_valid CHECK (
        status = ANY ('{pending,available,running,completed,discarded,uncertain,skipped,cancelled}'::text[])
        AND (finished_at IS NOT NULL)
            = (status = ANY ('{completed,discarded,skipped,cancelled}'::text[]))
        AND (output IS NULL OR status = 'completed')
        AND (available_at IS NOT NULL OR status <> 'available')
        AND (status <> 'running' OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL
                                     AND deadline_at IS NOT NULL))),
    ADD CONSTRAINT steps_counts_in_range CHECK (
        trigger_rule = ANY ('{all_success,all_done,one_failed}'::text[])
        AND deps_open >= 0 AND deps_failed >= 0
        AND deps_open + deps_failed <= cardinality(depends_on)
        AND max_attempts >= 1 AND attempt_budget >= 1
        AND resumes >= 0 AND resumes <= attempt);
