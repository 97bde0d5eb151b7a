-- Citus variants: functions of service/schema/ that a Citus coordinator cannot plan in
-- their set-based form, rewritten run by run with the same results. service/migrate.py
-- (distribute) applies this file after every migrate of a distributed database, so a
-- later migration that replaces one of them is replaced again. Plain Postgres keeps
-- the set-based forms (faster for CompleteMany). tests/citus/ runs them.

-- _runs_close (10_internals.sql), one run at a time: an UPDATE of a distributed table
-- may not call format() or jsonb_build_object() (STABLE) inside CASE, so the error of a
-- failed run is built by a SELECT first, then written.
CREATE OR REPLACE FUNCTION cyclone._runs_close(p_runs uuid[], p_closed integer[],
                                               p_now timestamptz)
RETURNS TABLE (run_id uuid, status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_run   uuid;
    v_was   record;
    v_done  boolean;
    v_error jsonb;
    v_status text;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_runs), 0) LOOP
        v_run := p_runs[i];
        -- The caller holds the run's lock: read, decide, then write once.
        SELECT r.steps_open, r.status, r.parent_run_id INTO v_was
          FROM cyclone.runs r WHERE r.run_id = v_run;
        CONTINUE WHEN NOT FOUND;
        v_done := v_was.steps_open <= p_closed[i] AND v_was.status = 'running';
        v_error := NULL;
        IF v_done THEN
            v_error := (SELECT jsonb_build_object(
                                   'kind', 'StepDiscarded',
                                   'message', format('node %s was discarded at attempt %s',
                                                     s.node, s.attempt),
                                   'node', s.node, 'attempt', s.attempt,
                                   'started_at', s.started_at)
                          FROM cyclone.steps s
                         WHERE s.run_id = v_run AND s.status = 'discarded'
                         ORDER BY s.finished_at, s.node LIMIT 1);
        END IF;
        v_status := CASE WHEN NOT v_done THEN v_was.status
                         WHEN v_error IS NULL THEN 'completed' ELSE 'failed' END;
        IF v_done THEN
            UPDATE cyclone.runs r
               SET steps_open = r.steps_open - p_closed[i], updated_at = p_now,
                   status = v_status, finished_at = p_now, error = v_error
             WHERE r.run_id = v_run;
        ELSE
            UPDATE cyclone.runs r
               SET steps_open = r.steps_open - p_closed[i], updated_at = p_now
             WHERE r.run_id = v_run;
        END IF;
        IF v_done AND v_was.parent_run_id IS NOT NULL THEN
            v_status := cyclone._child_finished(v_run, v_was.parent_run_id, v_status);
        END IF;
        run_id := v_run;
        status := v_status;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- cyclone.now() reads the clock, a reference table; a statement that Citus runs on a
-- shard and that calls now() reads it there, from the node's own copy, which Citus
-- counts as a nested distributed query unless allowed. The copy is local, so the read
-- is correct.
ALTER FUNCTION cyclone.now() SET citus.allow_nested_distributed_execution = on;

-- _notify_ready (10_internals.sql): a transition that Citus delegates to the worker node
-- of its run (a call SELECT ... FROM cyclone.f(run_id, ...) outside a transaction
-- block) runs there whole, the server's cyclone.ready read included; the worker's
-- sessions do not have the server's cyclone.defer_notify, so they defer by the node.
CREATE OR REPLACE FUNCTION cyclone._notify_ready(p_actions text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(p_actions) = 0 THEN
        RETURN;
    END IF;
    -- On a worker node (a transition delegated there), always: no server listens
    -- there, and the delegated statement returns cyclone.ready to the coordinator.
    IF current_setting('cyclone.defer_notify', true) = 'on'
       OR (SELECT l.groupid <> 0 FROM pg_catalog.pg_dist_local_group l) THEN
        -- Action names cannot contain a comma (pyclient.dag.NAME_PATTERN).
        PERFORM set_config('cyclone.ready',
                           concat_ws(',', nullif(current_setting('cyclone.ready', true), ''),
                                     array_to_string(p_actions, ',')),
                           true);
    ELSE
        PERFORM pg_notify('cyclone_ready', a) FROM (SELECT DISTINCT unnest(p_actions) AS a) t;
    END IF;
END;
$$;

-- _keys_room (35_flow.sql), key by key: its count of a key's running steps is a
-- subquery correlated with the key, which Citus cannot plan over a distributed table.
-- The same locks, taken on the coordinator (step_claim_flow is not delegated), so
-- claims of one key take turns across every shard; each key's running steps are
-- counted across shards once its lock is held.
CREATE OR REPLACE FUNCTION cyclone._keys_room(p_keys text[], p_limits integer[])
RETURNS TABLE (concurrency_key text, room integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_running integer;
BEGIN
    PERFORM pg_advisory_xact_lock(1667, l.h)
       FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(p_keys) k ORDER BY 1) l;
    FOR i IN 1 .. coalesce(cardinality(p_keys), 0) LOOP
        v_running := (SELECT count(*) FROM (
                         SELECT 1 FROM cyclone.steps s
                          WHERE s.concurrency_key = p_keys[i] AND s.status = 'running'
                          LIMIT p_limits[i]) n);
        concurrency_key := p_keys[i];
        room := greatest(p_limits[i] - v_running, 0);
        RETURN NEXT;
    END LOOP;
END;
$$;

-- The completion entry points force generic plans on plain Postgres (migration 0040,
-- 40_completion.sql). A Citus coordinator prunes a statement's shards by the values of
-- its parameters, which a generic plan does not have ("could not create distributed
-- plan"), so on Citus they plan with their arguments' values, as before 0040.
ALTER FUNCTION cyclone.step_complete_many(jsonb) RESET plan_cache_mode;
ALTER FUNCTION cyclone.step_report_many(jsonb, jsonb, jsonb, boolean) RESET plan_cache_mode;
ALTER FUNCTION cyclone._step_complete(uuid, text, uuid, jsonb) RESET plan_cache_mode;
ALTER FUNCTION cyclone.step_fail(uuid, text, uuid, text, text, text, boolean, interval)
    RESET plan_cache_mode;
ALTER FUNCTION cyclone.release_continue(uuid) RESET plan_cache_mode;

-- _child_finished (10_internals.sql): a child run that finishes in a transition
-- delegated to a worker node (step_complete_shard) may not write to its parent's shard
-- there. The wake it owes is kept on its own shard (child_wakes) and named in
-- cyclone.woken, which the server reads and delivers after the commit (child_wake).
-- On the coordinator (Cancel, Resolve, a worker's own completion transaction) the
-- parent's node is woken in the same transaction, as on one Postgres.
CREATE OR REPLACE FUNCTION cyclone._child_finished(p_run_id uuid, p_parent uuid,
                                                   p_status text)
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT l.groupid <> 0 FROM pg_catalog.pg_dist_local_group l) THEN
        INSERT INTO cyclone.child_wakes (run_id, parent_run_id, created_at)
        VALUES (p_run_id, p_parent, cyclone.now())
        ON CONFLICT (run_id) DO NOTHING;
        PERFORM set_config('cyclone.woken',
                           concat_ws(',', nullif(current_setting('cyclone.woken', true), ''),
                                     p_parent || ':' || p_run_id),
                           true);
    ELSE
        PERFORM cyclone._wake_waiting(p_parent, 'child ' || p_run_id);
    END IF;
    RETURN p_status;
END;
$$;

-- _key_wake (35_flow.sql) counts a key's running steps on every shard, which a
-- transition delegated to a worker node may not read. There it wakes the claims of the
-- step's action whenever a keyed step frees its slot, full key or not: a claim woken
-- for nothing finds nothing and waits again.
CREATE OR REPLACE FUNCTION cyclone._key_wake(p_action text, p_key text, p_limit integer,
                                             p_freed integer)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF (SELECT l.groupid <> 0 FROM pg_catalog.pg_dist_local_group l) THEN
        RETURN p_action;
    END IF;
    RETURN CASE WHEN (SELECT count(*) FROM (
                          SELECT 1 FROM cyclone.steps s
                           WHERE s.concurrency_key = p_key AND s.status = 'running'
                           LIMIT p_limit) n) + p_freed >= p_limit
                THEN p_action END;
END;
$$;
