-- Complete with an output: the completion transaction.

-- The completion transition, as the server applies it: a held step (running, same
-- token, lease not expired) becomes completed with its output; its dependents are
-- counted (_settle), or, with none, the run is closed by the count (_run_close). A
-- repeat with the token whose success was recorded answers duplicate = true and
-- changes nothing; any other mismatch raises CY001 (or CY002). RPC: Complete with an
-- output; also called by step_complete and step_complete_many.
CREATE FUNCTION cyclone._step_complete(p_run_id uuid, p_node text, p_lease_token uuid,
                                       p_output jsonb)
RETURNS cyclone.completion
LANGUAGE plpgsql
-- Generic plans, here and in the functions it calls (step_complete_many says why).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now        timestamptz := cyclone.now();
    v_status     text := cyclone._run_lock(p_run_id);
    v_dependents text[];
    v_action     text;
    v_key        text;
    v_limit      integer;
    v_step       record;
BEGIN
    UPDATE cyclone.steps s
       SET status = 'completed', output = coalesce(p_output, 'null'::jsonb),
           finished_at = v_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
    RETURNING s.dependents, s.action, s.concurrency_key, s.concurrency_limit
         INTO v_dependents, v_action, v_key, v_limit;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        IF v_step.status = 'completed' AND v_step.lease_token = p_lease_token THEN
            RETURN ROW('completed', v_status, true, NULL)::cyclone.completion;
        END IF;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                    v_step.lease_token, v_step.attempt);
    END IF;
    IF cardinality(v_dependents) = 0 THEN
        v_status := cyclone._run_close(p_run_id, 1, v_now);
    ELSE
        v_status := cyclone._settle(p_run_id, ARRAY[p_node], '{}', 1);
    END IF;
    IF v_key IS NOT NULL AND cyclone._key_wake(v_action, v_key, v_limit, 1) IS NOT NULL THEN
        -- A slot of the step's full concurrency key is free: wake its action's claims.
        PERFORM cyclone._notify_ready(ARRAY[v_action]);
    END IF;
    RETURN ROW('completed', v_status, false, NULL)::cyclone.completion;
END;
$$;

-- The completion transition as a worker calls it inside its own transaction, after its
-- business writes (docs/exactly-once.md): when the lease is lost it raises CY001 and
-- the whole transaction, business writes included, rolls back. A repeat raises CY005
-- instead of answering duplicate = true: a caller that commits without reading the
-- answer would otherwise commit its business write a second time. SECURITY DEFINER
-- with a pinned search_path: the only Cyclone function the cyclone_worker role may
-- call (90_roles.sql); the lease token is the capability. Not called by the server.
CREATE FUNCTION cyclone.step_complete(p_run_id uuid, p_node text,
                                                 p_lease_token uuid, p_output jsonb)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_done cyclone.completion := cyclone._step_complete(p_run_id, p_node, p_lease_token,
                                                        p_output);
BEGIN
    IF v_done.duplicate THEN
        RAISE EXCEPTION 'step (%, %) was already completed with this lease token', p_run_id,
            p_node
            USING ERRCODE = 'CY005',
                  DETAIL = 'This call repeats a completion that was committed before.',
                  HINT = 'Roll back: the step''s effect was committed with its first completion.';
    END IF;
    RETURN v_done;
END;
$$;

-- CompleteMany: applies a batch of outcomes in one transaction. p_items is a JSON
-- array of {i, run_id, node, lease_token, output} or {..., failure: {type, message,
-- details, retryable, retry_after_s, uncertain}}. Locks every run of the batch in
-- run_id order (so two batches cannot deadlock); applies every success whose lease
-- holds in one statement, closes runs whose completed steps have no dependents by
-- count (_runs_close) and settles the others once per run (_settle); then takes the
-- rest one at a time in (run_id, node) order, each in its own subtransaction so that
-- a refusal (CY001, CY002, CY003) stands alone and is returned in its row: failures
-- through step_fail or step_abandon, and successes the first pass did not apply
-- through _step_complete (a repeat answers duplicate). RPC: CompleteMany.
CREATE FUNCTION cyclone.step_complete_many(p_items jsonb)
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
-- Generic plans, for its own statements and for those of every function it calls
-- (_settle, _runs_close, ...): each is the same lookups by key for any argument, but a
-- list parameter is costed at ten items in a generic plan, so a statement passed one
-- or two (the join that a batch of a fan-out's leaves counts, the one run that _settle
-- closes, the lock of a batch all of one run) looked dearer generic and was planned
-- again at every call: 2.5 plans per batch of a fan-out's leaves, 5.5 % of Postgres's
-- work per step (docs/performance.md, "The engine's SQL").
SET plan_cache_mode = force_generic_plan
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
           -- (service.db.completion.outcomes_json), and printing the step's token costs less
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

-- The next chunk of a run's release in progress (cyclone.releases, _settle): its node
-- counted at up to 1,000 more of its dependents, under the run lock, taken first as
-- by every transition. Returns whether dependents are left to count; false when the
-- run has no release in progress, is gone, or is cancelled (its release is then
-- dropped: a cancelled run's steps are final). One chunk per call: the servers' release
-- loop (service/server.py) calls it in a transaction of its own until it answers false,
-- so that the run's completions and claims go on between chunks. Called also by
-- _release_finish.
CREATE FUNCTION cyclone.release_continue(p_run_id uuid) RETURNS boolean
LANGUAGE plpgsql
-- Generic plans, here and in _settle (step_complete_many says why).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_status text;
    v_node   text;
    v_next   integer;
BEGIN
    SELECT r.status INTO v_status FROM cyclone.runs r WHERE r.run_id = p_run_id
       FOR NO KEY UPDATE;
    SELECT x.node, x.next INTO v_node, v_next FROM cyclone.releases x
     WHERE x.run_id = p_run_id;
    IF NOT FOUND THEN
        RETURN false;
    ELSIF v_status = 'cancelled' THEN
        DELETE FROM cyclone.releases x WHERE x.run_id = p_run_id;
        RETURN false;
    END IF;
    PERFORM cyclone._settle(p_run_id, ARRAY[v_node], '{}', 0, v_next);
    RETURN EXISTS (SELECT 1 FROM cyclone.releases x WHERE x.run_id = p_run_id);
END;
$$;

-- The rest of a run's release in progress, in the caller's transaction: for a
-- transition that counts a run's steps from the graph (step_retry), which needs every
-- final counted at its dependents first. The caller holds the run lock.
CREATE FUNCTION cyclone._release_finish(p_run_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WHILE cyclone.release_continue(p_run_id) LOOP
    END LOOP;
END;
$$;

-- The runs with a release in progress, oldest first: the servers' release loop
-- continues each (release_continue) when woken, and at every sweep interval, for a
-- release that a stopped server left half way. PL/pgSQL: Citus plans no SQL function
-- with a parameter that reads a distributed table.
CREATE FUNCTION cyclone.releases_pending(p_limit integer) RETURNS SETOF uuid
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT x.run_id FROM cyclone.releases x ORDER BY x.created_at LIMIT p_limit;
END;
$$;
