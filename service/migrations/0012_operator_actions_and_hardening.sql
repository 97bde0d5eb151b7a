-- Operator actions keep the DAG's order; a repeated completion raises in a worker's
-- own transaction; idempotency keys outlive their runs; an unsafe handler that stops
-- without an outcome blocks its run; Retry grants a fresh attempt budget.
--
-- Step statuses and what sets them are listed in 0001; this migration changes:
--   pending    + step_retry: every node below a retried one that has not completed
--                waits again for its upstream (running ones lose their lease);
--                step_abandon while the run is blocked (held, effect uncertain)
--   uncertain  + step_abandon (an unsafe handler stopped without an outcome)
-- docs/state-machine.md says what each operator action does to the nodes below.

-- What an operator's Retry grants: the node's retry policy, counted from the attempt it
-- had reached. max_attempts stays the attempt number up to which the node may run, so
-- every check "attempt < max_attempts" keeps its meaning; Retry moves it to
-- attempt + attempt_budget instead of leaving a node at attempt 3 of 2.
ALTER TABLE cyclone.steps ADD COLUMN attempt_budget integer;
UPDATE cyclone.steps SET attempt_budget = max_attempts;
ALTER TABLE cyclone.steps
    ALTER COLUMN attempt_budget SET NOT NULL,
    ADD CONSTRAINT steps_attempt_budget_positive CHECK (attempt_budget >= 1);

-- An attempt ended by an operator's action on an upstream node (see step_retry).
ALTER TABLE cyclone.step_errors
    DROP CONSTRAINT step_errors_kind_known,
    ADD CONSTRAINT step_errors_kind_known
        CHECK (kind IN ('handler', 'lease_expired', 'resolved', 'reset'));

-- SubmitOnce keys, kept apart from the runs so that retention can delete a run and
-- still answer its key with the run it made (for the key retention period, which is at
-- least as long as the run's: a key is deleted only once its run is gone).
CREATE TABLE cyclone.submit_keys (
    workflow   text        NOT NULL,
    submit_key text        NOT NULL,
    run_id     uuid        NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (workflow, submit_key)
);
CREATE INDEX submit_keys_created_idx ON cyclone.submit_keys (created_at);
INSERT INTO cyclone.submit_keys (workflow, submit_key, run_id, created_at)
SELECT workflow, submit_key, run_id, created_at FROM cyclone.runs WHERE submit_key IS NOT NULL;
-- The keys table is now what makes a key unique; the runs keep theirs for display and
-- for ListRuns' filter.
ALTER TABLE cyclone.runs DROP CONSTRAINT runs_workflow_submit_key_unique;
CREATE INDEX runs_workflow_key_idx ON cyclone.runs (workflow, submit_key)
    WHERE submit_key IS NOT NULL;

CREATE OR REPLACE FUNCTION cyclone.run_submit(
    p_run_id uuid, p_workflow text, p_submit_key text, p_input jsonb, p_nodes jsonb,
    OUT run_id uuid, OUT created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    v_count integer := jsonb_array_length(p_nodes);
BEGIN
    IF p_submit_key IS NOT NULL THEN
        -- A concurrent SubmitOnce with the same key waits here for the first to end.
        INSERT INTO cyclone.submit_keys (workflow, submit_key, run_id, created_at)
        VALUES (p_workflow, p_submit_key, p_run_id, v_now)
        ON CONFLICT (workflow, submit_key) DO NOTHING;
        IF NOT FOUND THEN
            SELECT k.run_id INTO run_id FROM cyclone.submit_keys k
             WHERE k.workflow = p_workflow AND k.submit_key = p_submit_key;
            created := false;
            RETURN;
        END IF;
    END IF;

    INSERT INTO cyclone.runs (run_id, workflow, submit_key, status, input, steps_total,
                              steps_open, created_at, updated_at)
    VALUES (p_run_id, p_workflow, p_submit_key, 'running', p_input, v_count, v_count,
            v_now, v_now);

    INSERT INTO cyclone.steps (run_id, node, position, action, status, trigger_rule, depends_on,
                               dependents, deps_open, max_attempts, attempt_budget,
                               initial_backoff, max_backoff, backoff_multiplier, timeout,
                               input, available_at)
    SELECT p_run_id, n.name, n.position, n.action,
           CASE WHEN cardinality(n.depends_on) = 0 THEN 'available' ELSE 'pending' END,
           n.trigger_rule, n.depends_on, n.dependents, cardinality(n.depends_on),
           n.max_attempts, n.max_attempts, make_interval(secs => n.initial_backoff_s),
           make_interval(secs => n.max_backoff_s), n.backoff_multiplier,
           make_interval(secs => n.timeout_s), n.input,
           CASE WHEN cardinality(n.depends_on) = 0 THEN v_now END
      FROM jsonb_to_recordset(p_nodes) AS n(
               name text, position integer, action text, depends_on text[], dependents text[],
               trigger_rule text, max_attempts integer, initial_backoff_s float8,
               max_backoff_s float8, backoff_multiplier float8, timeout_s float8, input jsonb);

    PERFORM cyclone._notify_ready(array_agg(e.node->>'action'))
       FROM jsonb_array_elements(p_nodes) e(node)
      WHERE jsonb_array_length(e.node->'depends_on') = 0;
    run_id := p_run_id;
    created := true;
END;
$$;

-- Retention of SubmitOnce keys: up to p_limit keys older than p_age whose run is gone.
CREATE FUNCTION cyclone.submit_keys_purge(p_age interval, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    DELETE FROM cyclone.submit_keys k
     WHERE (k.workflow, k.submit_key) IN (
           SELECT o.workflow, o.submit_key FROM cyclone.submit_keys o
            WHERE o.created_at < cyclone.now() - p_age
              AND NOT EXISTS (SELECT 1 FROM cyclone.runs r WHERE r.run_id = o.run_id)
            ORDER BY o.created_at
            LIMIT p_limit
              FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

-- The completion transition, as the server applies it: a repeat with the token whose
-- success was recorded answers duplicate = true and changes nothing.
CREATE FUNCTION cyclone._step_complete(p_run_id uuid, p_node text, p_lease_token uuid,
                                       p_output jsonb)
RETURNS cyclone.completion
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now        timestamptz := cyclone.now();
    v_status     text := cyclone._run_lock(p_run_id);
    v_dependents text[];
    v_step       record;
BEGIN
    UPDATE cyclone.steps s
       SET status = 'completed', output = coalesce(p_output, 'null'::jsonb),
           finished_at = v_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'running'
       AND s.lease_token = p_lease_token AND s.lease_expires_at > v_now
    RETURNING s.dependents INTO v_dependents;
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
    RETURN ROW('completed', v_status, false, NULL)::cyclone.completion;
END;
$$;

-- The completion transition as a worker calls it inside its own transaction, after its
-- business writes (docs/exactly-once.md). A repeat raises CY005 instead of answering
-- duplicate = true: a caller that commits without reading the answer would otherwise
-- commit its business write a second time. The exception aborts the transaction, so
-- the exactly-once promise does not depend on the caller looking at a flag.
CREATE OR REPLACE FUNCTION cyclone.step_complete(p_run_id uuid, p_node text,
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
GRANT EXECUTE ON FUNCTION cyclone.step_complete(uuid, text, uuid, jsonb) TO cyclone_worker;

-- The handler of an action its worker marks unsafe_to_repeat stopped without an outcome
-- (time limit, cancellation, shutdown): its effect may have happened. Like a lost lease
-- met by an unsafe claim, the step becomes uncertain and the run blocked, at once; in a
-- run already blocked on another step it is held (pending, effect uncertain) and blocks
-- the run again when next claimed by a worker that marks it unsafe.
CREATE FUNCTION cyclone.step_abandon(p_run_id uuid, p_node text, p_lease_token uuid,
                                     p_type text, p_message text, p_details text)
RETURNS cyclone.completion
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
BEGIN
    UPDATE cyclone.steps s
       SET status = CASE WHEN v_status = 'running' THEN 'uncertain' ELSE 'pending' END,
           available_at = NULL, lease_expires_at = NULL, effect_uncertain = true,
           unsafe = true
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'running'
       AND s.lease_token = p_lease_token AND s.lease_expires_at > v_now
    RETURNING s.status, s.attempt, s.action, s.started_at INTO v_step;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                    v_step.lease_token, v_step.attempt);
    END IF;
    INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, details,
                                     retryable, at)
    VALUES (p_run_id, p_node, v_step.attempt, 'handler', coalesce(p_type, ''),
            coalesce(p_message, ''), coalesce(p_details, ''), false, v_now);
    IF v_step.status = 'uncertain' THEN
        -- Hold the run's ready steps, as _block_uncertain does.
        UPDATE cyclone.steps s SET status = 'pending', available_at = NULL
         WHERE s.run_id = p_run_id AND s.status = 'available';
        UPDATE cyclone.runs r
           SET status = 'blocked', updated_at = v_now,
               error = jsonb_build_object(
                   'kind', 'EffectUncertain',
                   'message', format(
                       'node %s (action %s) stopped at attempt %s, started %s, without an '
                       'outcome (%s); its effect may have happened. Check, then Resolve '
                       'with result, error or discard', p_node, v_step.action,
                       v_step.attempt, v_step.started_at,
                       left(concat_ws(': ', nullif(p_type, ''), nullif(p_message, '')), 200)),
                   'node', p_node, 'attempt', v_step.attempt,
                   'started_at', v_step.started_at)
         WHERE r.run_id = p_run_id;
        v_status := 'blocked';
    END IF;
    RETURN ROW(v_step.status, v_status, false, NULL)::cyclone.completion;
END;
$$;

-- _settle judges the pending steps whose upstream is all final. A root (no upstream)
-- is released whatever its trigger rule, as run_submit releases it.
CREATE OR REPLACE FUNCTION cyclone._settle(p_run_id uuid, p_final text[], p_decide text[], p_closed integer)
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
            -- A node with no upstream always runs, whatever its rule, as at submit
            -- (it is judged here when released after Resolve or reset by Retry).
            SELECT node, CASE WHEN cardinality(depends_on) = 0 THEN true
                              ELSE CASE trigger_rule
                                       WHEN 'all_success' THEN deps_failed = 0
                                       WHEN 'all_done' THEN true
                                       ELSE deps_failed > 0
                                   END
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

-- Retry (p_nodes) and RetryAll (p_nodes NULL) reopen discarded nodes in place. Every
-- node below them that has not completed waits again for its upstream: the walk goes
-- down the dependents but never through a completed node, whose output stands. Each
-- node it reaches (the retried ones included) becomes pending with its counters
-- recounted from the graph and a fresh attempt budget; one that was running loses its
-- lease, and since its effect may have happened it is marked uncertain like a lost
-- lease. Then those whose upstream is all final are judged by their trigger rule.
-- So no node can be claimed while a node above it is open again.
CREATE OR REPLACE FUNCTION cyclone.step_retry(p_run_id uuid, p_nodes text[], p_actor text,
                                              p_reason text)
RETURNS text[]
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_nodes  text[];
    v_bad    record;
    v_reset  text[];
    v_decide text[];
BEGIN
    IF v_status IN ('blocked', 'cancelled') THEN
        RAISE EXCEPTION 'run % is %: only a running or failed run can be retried',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    IF p_nodes IS NULL THEN
        v_nodes := ARRAY(SELECT s.node FROM cyclone.steps s
                          WHERE s.run_id = p_run_id AND s.status = 'discarded' ORDER BY s.node);
        IF cardinality(v_nodes) = 0 THEN
            RAISE EXCEPTION 'run % has no discarded node to retry', p_run_id
                USING ERRCODE = 'CY003';
        END IF;
    ELSE
        v_nodes := p_nodes;
        SELECT n.node, s.status INTO v_bad
          FROM unnest(p_nodes) n(node)
          LEFT JOIN cyclone.steps s ON s.run_id = p_run_id AND s.node = n.node
         WHERE s.status IS DISTINCT FROM 'discarded' LIMIT 1;
        IF FOUND AND v_bad.status IS NULL THEN
            RAISE EXCEPTION 'run % has no node %', p_run_id, left(v_bad.node, 200)
                USING ERRCODE = 'CY002';
        ELSIF FOUND THEN
            RAISE EXCEPTION 'node % is %, not discarded: only a discarded node can be retried',
                v_bad.node, v_bad.status USING ERRCODE = 'CY003';
        END IF;
    END IF;

    WITH RECURSIVE down(node) AS (
        SELECT unnest(v_nodes)
        UNION
        SELECT t.node
          FROM down d
          JOIN cyclone.steps s ON s.run_id = p_run_id AND s.node = d.node
          JOIN cyclone.steps t ON t.run_id = p_run_id AND t.node = ANY (s.dependents)
         WHERE t.status <> 'completed'
    )
    SELECT array_agg(node) INTO v_reset FROM down;

    INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
    SELECT p_run_id, s.node, s.attempt, 'reset', 'Reset',
           format('lease of worker %s revoked: an upstream node was retried', s.worker_id),
           true, v_now
      FROM cyclone.steps s
     WHERE s.run_id = p_run_id AND s.node = ANY (v_reset) AND s.status = 'running';

    -- Counts read the statuses before this statement: a reset upstream node counts as
    -- open, whatever it was.
    UPDATE cyclone.steps s
       SET status = 'pending', available_at = NULL, finished_at = NULL,
           lease_expires_at = NULL,
           effect_uncertain = s.effect_uncertain OR s.status = 'running',
           max_attempts = s.attempt + s.attempt_budget,
           deps_open = c.open, deps_failed = c.failed
      FROM (SELECT t.node,
                   count(u.node) FILTER (
                       WHERE u.node = ANY (v_reset)
                          OR u.status IN ('pending', 'available', 'running', 'uncertain'))
                       AS open,
                   count(u.node) FILTER (
                       WHERE NOT u.node = ANY (v_reset)
                         AND u.status IN ('discarded', 'skipped')) AS failed
              FROM cyclone.steps t
              LEFT JOIN cyclone.steps u ON u.run_id = t.run_id AND u.node = ANY (t.depends_on)
             WHERE t.run_id = p_run_id AND t.node = ANY (v_reset)
             GROUP BY t.node) c
     WHERE s.run_id = p_run_id AND s.node = c.node;

    UPDATE cyclone.runs r
       SET status = 'running', error = NULL, finished_at = NULL, updated_at = v_now,
           steps_open = (SELECT count(*) FROM cyclone.steps s
                          WHERE s.run_id = p_run_id
                            AND s.status IN ('pending', 'available', 'running', 'uncertain'))
     WHERE r.run_id = p_run_id;

    v_decide := ARRAY(SELECT s.node FROM cyclone.steps s
                       WHERE s.run_id = p_run_id AND s.node = ANY (v_reset) AND s.deps_open = 0);
    PERFORM cyclone._settle(p_run_id, '{}', v_decide, 0);
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, CASE WHEN p_nodes IS NULL THEN '' ELSE p_nodes[1] END,
            CASE WHEN p_nodes IS NULL THEN 'retry_all' ELSE 'retry' END, p_actor,
            coalesce(p_reason, ''),
            jsonb_build_object('nodes', to_jsonb(v_nodes),
                               'reset', to_jsonb(ARRAY(SELECT unnest(v_reset)
                                                       EXCEPT SELECT unnest(v_nodes)))),
            v_now);
    RETURN v_nodes;
END;
$$;

-- Resolve a blocked run's uncertain step. The lease token of the attempt that lost its
-- lease is forgotten: a late Complete with it is refused (ABORTED), never told that its
-- outcome was recorded. A discard grants a fresh attempt budget, as Retry does.
CREATE OR REPLACE FUNCTION cyclone.step_resolve(p_run_id uuid, p_node text, p_choice text,
                                                p_value jsonb, p_actor text, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
    v_held   text[];
BEGIN
    IF v_status <> 'blocked' THEN
        RAISE EXCEPTION 'run % is %, not blocked: only a blocked run can be resolved',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    SELECT s.status, s.attempt, s.action INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % has no node %', p_run_id, left(p_node, 200)
            USING ERRCODE = 'CY002';
    END IF;
    IF v_step.status <> 'uncertain' THEN
        RAISE EXCEPTION 'node % is %, not uncertain: only the uncertain step of a blocked run '
                        'can be resolved (here: %)', p_node, v_step.status,
            (SELECT string_agg(s.node, ', ') FROM cyclone.steps s
              WHERE s.run_id = p_run_id AND s.status = 'uncertain')
            USING ERRCODE = 'CY003';
    END IF;

    UPDATE cyclone.runs SET status = 'running', error = NULL, updated_at = v_now
     WHERE run_id = p_run_id;
    -- Release what was held while blocked.
    v_held := ARRAY(SELECT s.node FROM cyclone.steps s
                     WHERE s.run_id = p_run_id AND s.status = 'pending' AND s.deps_open = 0);
    CASE p_choice
    WHEN 'result' THEN
        UPDATE cyclone.steps s
           SET status = 'completed', output = coalesce(p_value, 'null'::jsonb),
               finished_at = v_now, effect_uncertain = false, lease_token = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], v_held, 1);
    WHEN 'error' THEN
        UPDATE cyclone.steps s
           SET status = 'discarded', finished_at = v_now, effect_uncertain = false,
               lease_token = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node;
        INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
        VALUES (p_run_id, p_node, v_step.attempt, 'resolved', 'EffectFailed',
                p_value #>> '{}', false, v_now);
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], v_held, 1);
    WHEN 'discard' THEN
        UPDATE cyclone.steps s
           SET status = 'available', available_at = v_now, effect_uncertain = false,
               lease_token = NULL, max_attempts = s.attempt + s.attempt_budget
         WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
        PERFORM cyclone._settle(p_run_id, '{}', v_held, 0);
    ELSE
        RAISE EXCEPTION 'unknown resolution %', left(p_choice, 50) USING ERRCODE = 'CY004';
    END CASE;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, p_node, 'resolve_' || p_choice, p_actor, coalesce(p_reason, ''),
            jsonb_build_object('attempt', v_step.attempt, 'value', p_value), v_now);
END;
$$;

-- CompleteMany: as before, through the server's _step_complete (a repeat answers
-- duplicate), and with step_abandon for failures that say their effect is uncertain.
CREATE OR REPLACE FUNCTION cyclone.step_complete_many(p_items jsonb)
 RETURNS TABLE(i integer, step_status text, run_status text, duplicate boolean, retry_at timestamp with time zone, error_state text, error_message text, error_detail text)
 LANGUAGE plpgsql
AS $$
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
    -- repeated completion, an unknown step), which _step_complete then explains.
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
