-- Completions run on generic plans (docs/performance.md, "The engine's SQL").
--
-- PL/pgSQL plans a statement with its arguments' values for its first five runs, then
-- keeps a generic plan only when that does not look dearer. A list parameter
-- (node = ANY (v_targets), unnest(p_runs, ...)) is costed at ten items in a generic
-- plan, so a statement whose calls pass one or two (the join that a batch of leaves
-- counts, the one run that _settle closes, the lock of a batch whose items are all of
-- one run) looked dearer generic than with its values, and was planned again at every
-- call: about 2.5 plans per completion batch of a fan-out, 5.5 % of Postgres's work
-- per fan step, and at each _settle of every run of a batch in a DAG. The plans are
-- the same lookups by key for every value, so the completion entry points now force
-- generic plans, for their own statements and for those of every function they call.

ALTER FUNCTION cyclone.step_complete_many(jsonb) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION cyclone.step_report_many(jsonb, jsonb, jsonb, boolean)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION cyclone._step_complete(uuid, text, uuid, jsonb)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION cyclone.step_fail(uuid, text, uuid, text, text, text, boolean, interval)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION cyclone.release_continue(uuid) SET plan_cache_mode = force_generic_plan;
