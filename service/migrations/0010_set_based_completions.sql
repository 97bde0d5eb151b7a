-- Completions in sets. A CompleteMany batch used to run step_complete once per item,
-- each in its own subtransaction: a dozen statements and a subtransaction per step.
-- Now the batch locks its runs, completes every step whose lease holds in one UPDATE,
-- closes the runs whose completed steps have no dependents in one more, and walks the
-- graph once per run that has dependents to count. Only what that pass did not apply
-- (failures, lost leases, repeats) still goes one item at a time, as before.
--
-- The graph walk (_settle) counts a whole wave of final steps at their dependents in
-- one statement, instead of one final step at a time: the 18 leaves of a fan-out that
-- finish in one batch now cost one update of their join, not 18.

-- _run_close for several runs at once: one statement. p_runs must not repeat a run.
CREATE FUNCTION cyclone._runs_close(p_runs uuid[], p_closed integer[], p_now timestamptz)
RETURNS TABLE (run_id uuid, status text)
LANGUAGE sql AS $$
    UPDATE cyclone.runs r
       SET steps_open = r.steps_open - c.closed,
           updated_at = p_now,
           status = CASE
               WHEN r.steps_open > c.closed OR r.status <> 'running' THEN r.status
               WHEN EXISTS (SELECT 1 FROM cyclone.steps s
                             WHERE s.run_id = r.run_id AND s.status = 'discarded')
               THEN 'failed'
               ELSE 'completed' END,
           finished_at = CASE
               WHEN r.steps_open > c.closed OR r.status <> 'running' THEN r.finished_at
               ELSE p_now END,
           error = CASE
               WHEN r.steps_open > c.closed OR r.status <> 'running' THEN r.error
               ELSE (SELECT jsonb_build_object(
                                'kind', 'StepDiscarded',
                                'message', format('node %s was discarded at attempt %s',
                                                  s.node, s.attempt),
                                'node', s.node, 'attempt', s.attempt,
                                'started_at', s.started_at)
                       FROM cyclone.steps s
                      WHERE s.run_id = r.run_id AND s.status = 'discarded'
                      ORDER BY s.finished_at, s.node LIMIT 1) END
      FROM unnest(p_runs, p_closed) AS c(run_id, closed)
     WHERE r.run_id = c.run_id
    RETURNING r.run_id, r.status
$$;

CREATE OR REPLACE FUNCTION cyclone._run_close(p_run_id uuid, p_closed integer,
                                              p_now timestamptz)
RETURNS text
LANGUAGE sql AS $$
    SELECT c.status FROM cyclone._runs_close(ARRAY[p_run_id], ARRAY[p_closed], p_now) c
$$;

-- Same contract as in 0006: p_final are steps of a locked run that just became final,
-- p_decide pending steps that may have no upstream left to wait for, p_closed how many
-- steps became final. Counts finals at their dependents, judges the steps left with no
-- upstream to wait for (ready, or skipped, which is final too and counted in turn),
-- releases the ready ones while the run is running, and closes the run by the count.
CREATE OR REPLACE FUNCTION cyclone._settle(p_run_id uuid, p_final text[], p_decide text[],
                                           p_closed integer)
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_wave    text[] := p_final;
    v_decide  text[] := p_decide;
    v_ready   text[] := '{}';
    v_runs    text[];
    v_closed  integer := p_closed;
    v_status  text;
BEGIN
    LOOP
        IF cardinality(v_wave) > 0 THEN
            -- Count the whole wave at each pending dependent, in one statement.
            WITH fin AS (
                SELECT d.node, count(*)::integer AS n,
                       (count(*) FILTER (WHERE f.status <> 'completed'))::integer AS failed
                  FROM cyclone.steps f CROSS JOIN LATERAL unnest(f.dependents) AS d(node)
                 WHERE f.run_id = p_run_id AND f.node = ANY (v_wave)
                 GROUP BY d.node
            ), counted AS (
                UPDATE cyclone.steps s
                   SET deps_open = s.deps_open - fin.n, deps_failed = s.deps_failed + fin.failed
                  FROM fin
                 WHERE s.run_id = p_run_id AND s.node = fin.node AND s.status = 'pending'
                RETURNING s.node, s.deps_open
            )
            SELECT v_decide || coalesce(array_agg(node), '{}') INTO v_decide
              FROM counted WHERE deps_open = 0;
        END IF;
        EXIT WHEN cardinality(v_decide) = 0;

        -- Judge the pending steps whose upstream is all final.
        WITH judged AS (
            SELECT node, CASE trigger_rule
                             WHEN 'all_success' THEN deps_failed = 0
                             WHEN 'all_done' THEN true
                             ELSE deps_failed > 0
                         END AS runs
              FROM cyclone.steps
             WHERE run_id = p_run_id AND node = ANY (v_decide)
               AND status = 'pending' AND deps_open = 0
        ), skipped AS (
            UPDATE cyclone.steps s SET status = 'skipped', finished_at = v_now
              FROM judged j
             WHERE s.run_id = p_run_id AND s.node = j.node AND NOT j.runs
               AND s.status = 'pending'
            RETURNING s.node
        )
        SELECT ARRAY(SELECT node FROM judged WHERE runs),
               ARRAY(SELECT node FROM skipped)
          INTO v_runs, v_wave;
        v_ready := v_ready || v_runs;
        v_closed := v_closed + cardinality(v_wave);
        v_decide := '{}';
    END LOOP;

    IF cardinality(v_ready) > 0 THEN
        SELECT status INTO v_status FROM cyclone.runs WHERE run_id = p_run_id;
        IF v_status = 'running' THEN
            WITH released AS (
                UPDATE cyclone.steps SET status = 'available', available_at = v_now
                 WHERE run_id = p_run_id AND node = ANY (v_ready) AND status = 'pending'
                RETURNING action)
            SELECT array_agg(action) INTO v_ready FROM released;
            PERFORM cyclone._notify_ready(v_ready);
        END IF;
    END IF;
    IF v_closed = 0 THEN
        RETURN (SELECT status FROM cyclone.runs WHERE run_id = p_run_id);
    END IF;
    RETURN cyclone._run_close(p_run_id, v_closed, v_now);
END;
$$;

-- Same contract as in 0004: one row per item, a refused item with its SQLSTATE.
-- A run's status in a row is the run's status after the whole batch.
CREATE OR REPLACE FUNCTION cyclone.step_complete_many(p_items jsonb)
RETURNS TABLE (i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, error_state text, error_message text,
               error_detail text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := cyclone.now();
    v_applied  integer[];
    v_run      uuid[];
    v_node     text[];
    v_has_deps boolean[];
    v_statuses jsonb;
    v_group    record;
    v_item     jsonb;
    v_done     cyclone.completion;
BEGIN
    -- Lock every run of the batch in run_id order, the order every batch locks in, so
    -- that two batches cannot deadlock.
    PERFORM 1 FROM cyclone.runs r
     WHERE r.run_id = ANY (ARRAY(SELECT DISTINCT (e->>'run_id')::uuid
                                   FROM jsonb_array_elements(p_items) e))
     ORDER BY r.run_id
       FOR NO KEY UPDATE;

    -- Every success whose lease still holds, in one statement (as step_complete).
    WITH item AS (
        SELECT (e->>'i')::integer AS i, (e->>'run_id')::uuid AS run_id, e->>'node' AS node,
               (e->>'lease_token')::uuid AS lease_token, e->'output' AS output
          FROM jsonb_array_elements(p_items) e
         WHERE NOT e ? 'failure'
    ), done AS (
        UPDATE cyclone.steps s
           SET status = 'completed', output = coalesce(t.output, 'null'::jsonb),
               finished_at = v_now, lease_expires_at = NULL
          FROM item t
         WHERE s.run_id = t.run_id AND s.node = t.node AND s.status = 'running'
           AND s.lease_token = t.lease_token AND s.lease_expires_at > v_now
        RETURNING t.i, s.run_id, s.node, cardinality(s.dependents) > 0 AS has_deps
    )
    SELECT coalesce(array_agg(i), '{}'), coalesce(array_agg(run_id), '{}'),
           coalesce(array_agg(node), '{}'), coalesce(array_agg(has_deps), '{}')
      INTO v_applied, v_run, v_node, v_has_deps
      FROM done;

    -- Runs where no completed step has a dependent: close them by the count, at once.
    SELECT coalesce(jsonb_object_agg(c.run_id, c.status), '{}') INTO v_statuses
      FROM (SELECT array_agg(g.run_id ORDER BY g.run_id) AS runs,
                   array_agg(g.n ORDER BY g.run_id) AS closed
              FROM (SELECT d.run_id, count(*)::integer AS n
                      FROM unnest(v_run, v_has_deps) d(run_id, has_deps)
                     GROUP BY d.run_id HAVING NOT bool_or(d.has_deps)) g) leaves,
           cyclone._runs_close(leaves.runs, leaves.closed, v_now) c;

    -- Runs with dependents to count: one graph walk per run, with all its finals.
    FOR v_group IN
        SELECT d.run_id, array_agg(d.node) AS nodes
          FROM unnest(v_run, v_node, v_has_deps) d(run_id, node, has_deps)
         GROUP BY d.run_id HAVING bool_or(d.has_deps)
         ORDER BY d.run_id
    LOOP
        v_statuses := v_statuses || jsonb_build_object(
            v_group.run_id::text,
            cyclone._settle(v_group.run_id, v_group.nodes, '{}', cardinality(v_group.nodes)));
    END LOOP;

    RETURN QUERY
        SELECT d.i, 'completed'::text, v_statuses->>(d.run_id::text), false,
               NULL::timestamptz, NULL::text, NULL::text, NULL::text
          FROM unnest(v_applied, v_run) d(i, run_id);

    -- The rest one at a time, each in its own subtransaction so that a refusal stands
    -- alone: failures, and successes the pass above did not apply (a lost lease, a
    -- repeated completion, an unknown step), which step_complete then explains.
    FOR v_item IN
        SELECT e FROM jsonb_array_elements(p_items) e
         WHERE NOT (e->>'i')::integer = ANY (v_applied)
         ORDER BY e->>'run_id', e->>'node', (e->>'i')::integer
    LOOP
        i := (v_item->>'i')::integer;
        BEGIN
            IF v_item ? 'failure' THEN
                v_done := cyclone.step_fail(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'failure'->>'type', v_item->'failure'->>'message',
                    v_item->'failure'->>'details', (v_item->'failure'->>'retryable')::boolean,
                    make_interval(secs => (v_item->'failure'->>'retry_after_s')::float8));
            ELSE
                v_done := cyclone.step_complete(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'output');
            END IF;
            step_status := v_done.step_status;
            run_status := v_done.run_status;
            duplicate := v_done.duplicate;
            retry_at := v_done.retry_at;
            error_state := NULL;
            error_message := NULL;
            error_detail := NULL;
        EXCEPTION WHEN SQLSTATE 'CY001' OR SQLSTATE 'CY002' OR SQLSTATE 'CY003' THEN
            GET STACKED DIAGNOSTICS error_state = RETURNED_SQLSTATE,
                                    error_message = MESSAGE_TEXT,
                                    error_detail = PG_EXCEPTION_DETAIL;
            step_status := NULL;
            run_status := NULL;
            duplicate := NULL;
            retry_at := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;
