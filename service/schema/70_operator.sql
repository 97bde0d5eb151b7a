-- Operator transitions: Retry, Resolve, CancelRun, SetRunTags. Each locks the run row
-- first, so two operators acting at once on one run are serialised, and records itself
-- in cyclone.audit. docs/state-machine.md says what each does to the nodes below.

-- Retry (p_nodes) and RetryAll (p_nodes NULL) reopen discarded nodes in place: same
-- run_id and node; the next claim increments attempt. Every node below them that has
-- not completed waits again for its upstream: the walk goes down the dependents but
-- never through a completed node, whose output stands. Each node it reaches (the
-- retried ones included) becomes pending with its counters recounted from the graph
-- and a fresh attempt budget (max_attempts = attempt - resumes - recoveries +
-- attempt_budget: the claims that resumed a wait and the attempts whose worker was lost
-- never counted); one that was
-- running loses its lease (a reset error is recorded), and since its effect may have
-- happened it is marked effect_uncertain like a lost lease. The run becomes running,
-- and the reset nodes whose upstream is all final are judged by their trigger rule
-- (_settle). So no node can be claimed while a node above it is open again. Returns
-- the retried nodes. CY003 when a node is not discarded, the run has none (RetryAll),
-- or the run is blocked or cancelled; CY002 for an unknown node. RPCs: Retry, RetryAll.
CREATE FUNCTION cyclone.step_retry(p_run_id uuid, p_nodes text[], p_actor text,
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
    -- The counts below are read from the graph: every final must be counted at its
    -- dependents first, a release in progress too.
    PERFORM cyclone._release_finish(p_run_id);
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
        -- In the node names' collation (steps.node is COLLATE "C", migration 0042).
        SELECT unnest(v_nodes) COLLATE "C"
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
           max_attempts = s.attempt - s.resumes - s.recoveries + s.attempt_budget,
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
    -- The details first: Citus takes no subquery in an INSERT.
    v_reset := ARRAY(SELECT unnest(v_reset) EXCEPT SELECT unnest(v_nodes));
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, CASE WHEN p_nodes IS NULL THEN '' ELSE p_nodes[1] END,
            CASE WHEN p_nodes IS NULL THEN 'retry_all' ELSE 'retry' END, p_actor,
            coalesce(p_reason, ''),
            jsonb_build_object('nodes', to_jsonb(v_nodes), 'reset', to_jsonb(v_reset)),
            v_now);
    RETURN v_nodes;
END;
$$;

-- Resolves a blocked run's uncertain step: result (the effect happened: the value is
-- its output, completed), error (it happened and failed: discarded, a resolved error
-- recorded, so failure-handling nodes run) or discard (it did not happen: available
-- again, with a fresh attempt budget as Retry grants). The run becomes running and the
-- steps held while it was blocked are released (_settle); in a paused run they, and a
-- discarded node, stay held until run_resume. The lease token of the
-- attempt that lost its lease is forgotten: a late Complete with it is refused, never
-- told that its outcome was recorded. CY003 when the run is not blocked or the node is
-- not its uncertain step or the run is blocked on a step call (step_call_resolve),
-- CY002 for an unknown node, CY004 for an unknown choice. RPC: Resolve.
CREATE FUNCTION cyclone.step_resolve(p_run_id uuid, p_node text, p_choice text,
                                                p_value jsonb, p_actor text, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
    v_held   text[];
    v_error  jsonb;
    v_paused boolean;
BEGIN
    IF v_status <> 'blocked' THEN
        RAISE EXCEPTION 'run % is %, not blocked: only a blocked run can be resolved',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    SELECT r.error INTO v_error FROM cyclone.runs r WHERE r.run_id = p_run_id;
    IF v_error ? 'step_id' THEN
        RAISE EXCEPTION 'run % is blocked on step call % of node %: resolve it with step_id %',
            p_run_id, v_error->>'step_id', v_error->>'node', v_error->>'step_id'
            USING ERRCODE = 'CY003';
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

    UPDATE cyclone.runs r SET status = 'running', error = NULL, updated_at = v_now
     WHERE r.run_id = p_run_id
    RETURNING r.paused_at IS NOT NULL INTO v_paused;
    -- Release what was held while blocked (_settle holds it still in a paused run).
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
           SET status = CASE WHEN v_paused THEN 'pending' ELSE 'available' END,
               available_at = v_now, effect_uncertain = false, lease_token = NULL,
               max_attempts = s.attempt - s.resumes - s.recoveries + s.attempt_budget
         WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._notify_ready(CASE WHEN v_paused THEN '{}' ELSE ARRAY[v_step.action] END);
        PERFORM cyclone._settle(p_run_id, '{}', v_held, 0);
    ELSE
        RAISE EXCEPTION 'unknown resolution %', left(p_choice, 50) USING ERRCODE = 'CY004';
    END CASE;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, p_node, 'resolve_' || p_choice, p_actor, coalesce(p_reason, ''),
            jsonb_build_object('attempt', v_step.attempt, 'value', p_value), v_now);
END;
$$;

-- Resolves a run blocked on a step call of a durable function (its error names the
-- node and step_id; p_node NULL means that node): result records the call's success
-- with p_value, error its failure {type EffectFailed, message p_value} (the body's
-- except runs on replay), discard deletes its entry (the call runs on replay). In each
-- case the node becomes available with a fresh attempt budget (as Retry grants), the
-- run running, and the steps held while it was blocked are released (_settle). Returns
-- the node. CY003 when the run is not blocked on that step call (the message names
-- what it is blocked on), CY002 for an unknown node, CY004 for an unknown choice.
-- RPC: Resolve with step_id.
CREATE FUNCTION cyclone.step_call_resolve(
    p_run_id uuid, p_node text, p_step_id text, p_choice text, p_value jsonb, p_actor text,
    p_reason text)
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_error  jsonb;
    v_node   text;
    v_step   record;
    v_held   text[];
    v_paused boolean;
BEGIN
    IF p_choice IS NULL OR p_choice NOT IN ('result', 'error', 'discard') THEN
        RAISE EXCEPTION 'unknown resolution %', left(p_choice, 50) USING ERRCODE = 'CY004';
    END IF;
    IF v_status <> 'blocked' THEN
        RAISE EXCEPTION 'run % is %, not blocked: only a blocked run can be resolved',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    SELECT r.error INTO v_error FROM cyclone.runs r WHERE r.run_id = p_run_id;
    v_node := coalesce(nullif(p_node, ''), v_error->>'node');
    SELECT s.status, s.attempt, s.action INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = v_node FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % has no node %', p_run_id, left(v_node, 200)
            USING ERRCODE = 'CY002';
    END IF;
    IF NOT v_error ? 'step_id' THEN
        RAISE EXCEPTION 'run % is blocked on node % itself, not on a step call: resolve it '
                        'without step_id', p_run_id, v_error->>'node'
            USING ERRCODE = 'CY003';
    END IF;
    IF v_error->>'node' IS DISTINCT FROM v_node
       OR v_error->>'step_id' IS DISTINCT FROM p_step_id THEN
        RAISE EXCEPTION 'run % is blocked on step call % of node %, not on % of %',
            p_run_id, v_error->>'step_id', v_error->>'node', left(p_step_id, 200),
            left(v_node, 200)
            USING ERRCODE = 'CY003';
    END IF;

    CASE p_choice
    WHEN 'result' THEN
        UPDATE cyclone.step_calls c
           SET status = 'succeeded', output = coalesce(p_value, 'null'::jsonb),
               finished_at = v_now
         WHERE c.run_id = p_run_id AND c.node = v_node AND c.step_id = p_step_id
           AND c.status = 'started';
    WHEN 'error' THEN
        UPDATE cyclone.step_calls c
           SET status = 'failed', finished_at = v_now,
               error = jsonb_build_object('type', 'EffectFailed', 'message',
                                          coalesce(p_value #>> '{}', ''), 'details', '')
         WHERE c.run_id = p_run_id AND c.node = v_node AND c.step_id = p_step_id
           AND c.status = 'started';
    ELSE
        DELETE FROM cyclone.step_calls c
         WHERE c.run_id = p_run_id AND c.node = v_node AND c.step_id = p_step_id
           AND c.status = 'started';
    END CASE;

    UPDATE cyclone.runs r SET status = 'running', error = NULL, updated_at = v_now
     WHERE r.run_id = p_run_id
    RETURNING r.paused_at IS NOT NULL INTO v_paused;
    -- Release what was held while blocked (_settle holds it still in a paused run).
    v_held := ARRAY(SELECT s.node FROM cyclone.steps s
                     WHERE s.run_id = p_run_id AND s.status = 'pending' AND s.deps_open = 0);
    UPDATE cyclone.steps s
       SET status = CASE WHEN v_paused THEN 'pending' ELSE 'available' END,
           available_at = v_now, effect_uncertain = false, lease_token = NULL,
           max_attempts = s.attempt - s.resumes - s.recoveries + s.attempt_budget
     WHERE s.run_id = p_run_id AND s.node = v_node;
    PERFORM cyclone._notify_ready(CASE WHEN v_paused THEN '{}' ELSE ARRAY[v_step.action] END);
    PERFORM cyclone._settle(p_run_id, '{}', v_held, 0);
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, v_node, 'resolve_' || p_choice, p_actor, coalesce(p_reason, ''),
            jsonb_build_object('attempt', v_step.attempt, 'step_id', p_step_id,
                               'value', p_value),
            v_now);
    RETURN v_node;
END;
$$;

-- Cancels a run: every unfinished step becomes cancelled (a running handler learns it
-- from its next heartbeat, and its completion is refused), and the run's error is
-- cleared (_run_cancel_one); a parent node waiting for it is woken
-- (_child_finished). Unless p_keep_children, every descendant run (its child runs,
-- theirs, ...) that is running or blocked is cancelled with it, each with its own audit
-- entry naming the run whose cancel reached it. The descendants are locked first,
-- level by level from the top and each level in run_id order, before any step
-- changes: a locked run starts no child (child_start takes its run's lock), so each
-- level is complete once the one above is locked; and a child finishing meanwhile,
-- which locks its own run before it touches its parent's node, never waits on a lock
-- held here. CY003 when the run is already completed or cancelled. RPC: CancelRun.
CREATE FUNCTION cyclone.run_cancel(p_run_id uuid, p_actor text, p_reason text,
                                   p_keep_children boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_level  uuid[] := ARRAY[p_run_id];
    v_tree   uuid[] := '{}';
    v_child  record;
    v_child_id uuid;
    v_parent uuid;
BEGIN
    IF v_status IN ('completed', 'cancelled') THEN
        RAISE EXCEPTION 'run % is already %', p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    IF NOT p_keep_children THEN
        LOOP
            -- Found, then locked one by one in run_id order (on Citus a lock is taken
            -- on one shard at a time).
            v_level := ARRAY(SELECT r.run_id FROM cyclone.runs r
                              WHERE r.parent_run_id = ANY (v_level) ORDER BY r.run_id);
            EXIT WHEN cardinality(v_level) = 0;
            FOR i IN 1 .. cardinality(v_level) LOOP
                v_child_id := v_level[i];
                PERFORM 1 FROM cyclone.runs r WHERE r.run_id = v_child_id FOR NO KEY UPDATE;
            END LOOP;
            v_tree := v_tree || v_level;
        END LOOP;
    END IF;
    PERFORM cyclone._run_cancel_one(p_run_id, p_actor, coalesce(p_reason, ''),
                                    jsonb_build_object('previous_status', v_status,
                                                       'keep_children', p_keep_children),
                                    v_now);
    -- A child cancelled on its own: its parent may wait for it. (The parent is read
    -- first: on Citus it may live on another shard than this run's statement.)
    v_parent := (SELECT r.parent_run_id FROM cyclone.runs r WHERE r.run_id = p_run_id);
    IF v_parent IS NOT NULL THEN
        PERFORM cyclone._child_finished(p_run_id, v_parent, 'cancelled');
    END IF;
    FOR v_child IN
        SELECT r.run_id, r.status FROM cyclone.runs r
         WHERE r.run_id = ANY (v_tree) AND r.status IN ('running', 'blocked')
         ORDER BY r.run_id
    LOOP
        PERFORM cyclone._run_cancel_one(
            v_child.run_id, p_actor,
            concat('run ', p_run_id, ' was cancelled', ': ' || nullif(p_reason, '')),
            jsonb_build_object('previous_status', v_child.status, 'cancelled_with', p_run_id),
            v_now);
    END LOOP;
END;
$$;

-- Changes a run's tags, which are otherwise fixed at submit (SetRunTags): the keys of
-- p_remove go, then the keys of p_set take its values (a key in both is set), in
-- runs.tags and in cyclone.run_tags. CY004
-- when the run would carry more than p_max tags. Recorded in the audit trail as
-- set_tags, with the tags before and after. Returns the tags after ('{}': none).
CREATE FUNCTION cyclone.run_tags_set(p_run_id uuid, p_set jsonb, p_remove text[],
                                     p_max integer, p_actor text, p_reason text)
RETURNS jsonb
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_run    record;
    v_before jsonb;
    v_after  jsonb;
BEGIN
    SELECT coalesce(r.tags, '{}') AS tags, r.created_at INTO v_run
      FROM cyclone.runs r WHERE r.run_id = p_run_id;
    v_before := v_run.tags;
    v_after := (v_before - coalesce(p_remove, '{}')) || coalesce(p_set, '{}');
    IF (SELECT count(*) FROM jsonb_object_keys(v_after)) > p_max THEN
        RAISE EXCEPTION 'run % would carry % tags; at most % are allowed', p_run_id,
            (SELECT count(*) FROM jsonb_object_keys(v_after)), p_max USING ERRCODE = 'CY004';
    END IF;
    UPDATE cyclone.runs r SET tags = nullif(v_after, '{}') WHERE r.run_id = p_run_id;
    DELETE FROM cyclone.run_tags t WHERE t.run_id = p_run_id;
    INSERT INTO cyclone.run_tags (run_id, key, value, created_at)
    SELECT p_run_id, e.key, e.value, v_run.created_at FROM jsonb_each_text(v_after) e;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, '', 'set_tags', p_actor, coalesce(p_reason, ''),
            jsonb_build_object('before', v_before, 'after', v_after, 'status', v_status),
            v_now);
    RETURN v_after;
END;
$$;
