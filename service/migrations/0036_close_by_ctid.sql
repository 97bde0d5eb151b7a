-- The run's close and step_complete_many, cheaper per step (docs/performance.md, "The
-- engine's SQL").
--
-- _runs_close finds each run by key and updates it by ctid: its join of the list with
-- runs by = ANY compared every run with every entry of the list. It looks a closing
-- run's first discarded step up once, and answers from the update's RETURNING.
-- step_complete_many parses each item's run_id once, compares the lease token as text
-- (the server writes ids in canonical form; an item written otherwise is applied one
-- at a time, as before), opens no settle query when no completed step has dependents,
-- and keeps in its map of run statuses only the runs that are not completed.
CREATE OR REPLACE FUNCTION cyclone._runs_close(p_runs uuid[], p_closed integer[],
                                               p_now timestamptz)
RETURNS TABLE (run_id uuid, status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        UPDATE cyclone.runs r
           SET steps_open = r.steps_open - c.closed,
               updated_at = p_now,
               status = CASE WHEN NOT c.closing THEN r.status
                             WHEN c.error IS NULL THEN 'completed' ELSE 'failed' END,
               finished_at = CASE WHEN c.closing THEN p_now ELSE r.finished_at END,
               error = coalesce(c.error, r.error)
          -- Each run read once by key (the callers hold its lock, so the version read
          -- is the one updated), then updated by its ctid: no join of the runs with the
          -- list, whatever the statistics. A run that closes here has its first
          -- discarded step looked up, once, by key (CASE evaluates the lookup only for
          -- a closing run); its StepDiscarded error makes it failed.
          FROM (SELECT c.closed, x.row_id, x.closing,
                       CASE WHEN x.closing THEN (
                           SELECT jsonb_build_object(
                                      'kind', 'StepDiscarded',
                                      'message', format('node %s was discarded at attempt %s',
                                                        s.node, s.attempt),
                                      'node', s.node, 'attempt', s.attempt,
                                      'started_at', s.started_at)
                             FROM cyclone.steps s
                            WHERE s.run_id = c.run_id AND s.status = 'discarded'
                            ORDER BY s.finished_at, s.node LIMIT 1) END AS error
                  FROM unnest(p_runs, p_closed) AS c(run_id, closed)
                 CROSS JOIN LATERAL (
                       SELECT x.ctid AS row_id,
                              x.steps_open <= c.closed AND x.status = 'running' AS closing
                         FROM cyclone.runs x WHERE x.run_id = c.run_id OFFSET 0) x
                -- OFFSET 0: one lookup per run, however often its error is named.
                OFFSET 0) c
         WHERE r.ctid = c.row_id
        -- CASE evaluates its branch only when taken: runs without a parent, and runs
        -- that did not finish here, cost nothing more.
        RETURNING r.run_id,
                  CASE WHEN r.parent_run_id IS NOT NULL AND r.finished_at = p_now
                       THEN cyclone._child_finished(r.run_id, r.parent_run_id, r.status)
                       ELSE r.status END;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone.step_complete_many(p_items jsonb)
RETURNS TABLE (i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, error_state text, error_message text,
               error_detail text)
LANGUAGE plpgsql
-- Each item's step is found by its key. Left to itself, the planner hashes the whole
-- steps table for the batch's join while the table is small (a few thousand rows,
-- plus the dead versions that a busy table piles up between vacuums): in the waits
-- bench that was a sequential scan per batch, 1.5 million rows read for 3,000 runs.
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := cyclone.now();
    v_applied  integer[];
    -- Each item's run_id, in item order, parsed once (for the locks and the update).
    v_item_run uuid[];
    v_run      uuid[];
    v_node     text[];
    v_has_deps boolean[];
    -- The completed steps with a concurrency key: their actions, keys and limits.
    v_keyed    text[];
    v_keys     text[];
    v_limits   integer[];
    -- The status of each run of the batch that is not completed now, by run_id (a
    -- run of the batch that is absent is completed): most batches close all their
    -- runs, and then no run_id is written as text, neither here nor in the answer.
    v_statuses jsonb;
    v_all_completed boolean;
    v_group    record;
    v_status   text;
    v_item     jsonb;
    v_done     cyclone.completion;
BEGIN
    -- Lock every run of the batch in run_id order, the order every batch locks in, so
    -- that two batches cannot deadlock.
    -- (An index scan by = ANY reads each distinct key once, in key order.)
    v_item_run := ARRAY(SELECT (e.value->>'run_id')::uuid
                          FROM jsonb_array_elements(p_items) WITH ORDINALITY AS e(value, n)
                         ORDER BY e.n);
    PERFORM 1 FROM cyclone.runs r
     WHERE r.run_id = ANY (v_item_run)
     ORDER BY r.run_id
       FOR NO KEY UPDATE;

    -- Every success whose lease still holds, in one statement (as step_complete).
    WITH item AS (
        SELECT (e->>'i')::integer AS i, v_item_run[x.n] AS run_id, e->>'node' AS node,
               e->>'lease_token' AS lease_token, e->'output' AS output
          FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, n)
         WHERE NOT e ? 'failure'
    ), done AS (
        UPDATE cyclone.steps s
           SET status = 'completed', output = coalesce(t.output, 'null'::jsonb),
               finished_at = v_now, lease_expires_at = NULL
          FROM item t
         WHERE s.run_id = t.run_id AND s.node = t.node
           -- The token as text: the server writes ids in their canonical form
           -- (service.store.outcomes_json), and printing the step's token costs less
           -- than parsing the item's. An item whose token is written otherwise is not
           -- applied here, and _step_complete applies it below.
           AND s.lease_token::text = t.lease_token
           -- By key: see steps_leased_idx.
           AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
        RETURNING t.i, s.run_id, s.node, cardinality(s.dependents) > 0 AS has_deps,
                  s.action, s.concurrency_key, s.concurrency_limit
    )
    SELECT coalesce(array_agg(i), '{}'), coalesce(array_agg(run_id), '{}'),
           coalesce(array_agg(node), '{}'), coalesce(array_agg(has_deps), '{}'),
           coalesce(array_agg(action) FILTER (WHERE concurrency_key IS NOT NULL), '{}'),
           coalesce(array_agg(concurrency_key) FILTER (WHERE concurrency_key IS NOT NULL), '{}'),
           coalesce(array_agg(concurrency_limit) FILTER (WHERE concurrency_key IS NOT NULL),
                    '{}')
      INTO v_applied, v_run, v_node, v_has_deps, v_keyed, v_keys, v_limits
      FROM done;
    -- Slots of full concurrency keys are free: wake the claims of those steps' actions.
    IF cardinality(v_keys) > 0 THEN
        PERFORM cyclone._notify_ready(ARRAY(
            SELECT DISTINCT w.action
              FROM (SELECT k.action, k.key, min(k.lim) AS lim, count(*)::integer AS n
                      FROM unnest(v_keyed, v_keys, v_limits) AS k(action, key, lim)
                     GROUP BY k.action, k.key) k
             CROSS JOIN LATERAL (SELECT cyclone._key_wake(k.action, k.key, k.lim, k.n)
                                        AS action) w
             WHERE w.action IS NOT NULL));
    END IF;

    -- Runs where no completed step has a dependent: close them by the count, at once.
    SELECT coalesce(jsonb_object_agg(c.run_id, c.status)
                        FILTER (WHERE c.status IS DISTINCT FROM 'completed'), '{}')
      INTO v_statuses
      FROM (SELECT array_agg(g.run_id ORDER BY g.run_id) AS runs,
                   array_agg(g.n ORDER BY g.run_id) AS closed
              FROM (SELECT d.run_id, count(*)::integer AS n
                      FROM unnest(v_run, v_has_deps) d(run_id, has_deps)
                     GROUP BY d.run_id HAVING NOT bool_or(d.has_deps)) g) leaves,
           cyclone._runs_close(leaves.runs, leaves.closed, v_now) c;

    -- Runs with dependents to count: one graph walk per run, with all its finals. None
    -- when no completed step has a dependent (the query is not even opened).
    IF true = ANY (v_has_deps) THEN
        FOR v_group IN
            SELECT d.run_id, array_agg(d.node) AS nodes
              FROM unnest(v_run, v_node, v_has_deps) d(run_id, node, has_deps)
             GROUP BY d.run_id HAVING bool_or(d.has_deps)
             ORDER BY d.run_id
        LOOP
            v_status := cyclone._settle(v_group.run_id, v_group.nodes, '{}',
                                        cardinality(v_group.nodes));
            IF v_status IS DISTINCT FROM 'completed' THEN
                v_statuses := v_statuses || jsonb_build_object(v_group.run_id::text, v_status);
            END IF;
        END LOOP;
    END IF;

    v_all_completed := v_statuses = '{}';
    RETURN QUERY
        SELECT d.i, 'completed'::text,
               CASE WHEN v_all_completed THEN 'completed'
                    ELSE coalesce(v_statuses->>(d.run_id::text), 'completed') END, false,
               NULL::timestamptz, NULL::text, NULL::text, NULL::text
          FROM unnest(v_applied, v_run) d(i, run_id);

    -- The rest one at a time, each in its own subtransaction so that a refusal stands
    -- alone: failures, and successes the pass above did not apply (a lost lease, a
    -- repeated completion, an unknown step), which _step_complete then explains. None
    -- when the pass applied every item (an item names one step: one row each).
    IF cardinality(v_applied) = jsonb_array_length(p_items) THEN
        RETURN;
    END IF;
    FOR v_item IN
        SELECT e FROM jsonb_array_elements(p_items) e
         WHERE NOT (e->>'i')::integer = ANY (v_applied)
         ORDER BY e->>'run_id', e->>'node', (e->>'i')::integer
    LOOP
        i := (v_item->>'i')::integer;
        BEGIN
            IF (v_item->'failure'->>'uncertain')::boolean THEN
                v_done := cyclone.step_abandon(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'failure'->>'type', v_item->'failure'->>'message',
                    v_item->'failure'->>'details');
            ELSIF v_item ? 'failure' THEN
                v_done := cyclone.step_fail(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'failure'->>'type', v_item->'failure'->>'message',
                    v_item->'failure'->>'details', (v_item->'failure'->>'retryable')::boolean,
                    make_interval(secs => (v_item->'failure'->>'retry_after_s')::float8));
            ELSE
                v_done := cyclone._step_complete(
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
