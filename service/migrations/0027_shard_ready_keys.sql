-- Shard-ready keys: every unique constraint contains run_id, so that the
-- run-level tables can be distributed by run_id on Citus (docs/scaling.md), and the
-- engine behaves the same on one Postgres.
--
-- SubmitOnce: the key table was unique on (workflow, submit_key), which no shard key
-- can enforce. A key now has an id, submit_key_id(workflow, key), a name-based UUID
-- (SHA-256), which is its primary key, and a keyed run made from now on takes that id
-- as its run_id: the run's primary key and the key's are one value, on one shard.
-- Keys made before keep their run (run_id differs from key_id for them).
--
-- audit: its primary key was the identity column alone; it is now (run_id, id), which
-- also serves the run's trail in order (audit_run_idx is no longer needed).

CREATE FUNCTION cyclone.submit_key_id(p_workflow text, p_submit_key text) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT encode(set_byte(set_byte(d, 6, (get_byte(d, 6) & 15) | 128),
                           8, (get_byte(d, 8) & 63) | 128), 'hex')::uuid
      FROM (SELECT substring(sha256('cyclone submit key'::bytea || '\x00'::bytea
                                    || convert_to(p_workflow, 'UTF8') || '\x00'::bytea
                                    || convert_to(p_submit_key, 'UTF8')) FROM 1 FOR 16)) AS h(d)
$$;

ALTER TABLE cyclone.submit_keys ADD COLUMN key_id uuid;
UPDATE cyclone.submit_keys SET key_id = cyclone.submit_key_id(workflow, submit_key);
ALTER TABLE cyclone.submit_keys ALTER COLUMN key_id SET NOT NULL;
ALTER TABLE cyclone.submit_keys DROP CONSTRAINT submit_keys_pkey;
ALTER TABLE cyclone.submit_keys ADD PRIMARY KEY (key_id);

ALTER TABLE cyclone.audit DROP CONSTRAINT audit_pkey;
ALTER TABLE cyclone.audit ADD PRIMARY KEY (run_id, id);
DROP INDEX cyclone.audit_run_idx;

CREATE OR REPLACE FUNCTION cyclone.run_submit(
    p_run_id uuid, p_workflow text, p_submit_key text, p_input jsonb, p_nodes jsonb,
    p_start_at timestamptz DEFAULT NULL, p_priority integer DEFAULT 0,
    OUT run_id uuid, OUT created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    v_count integer := jsonb_array_length(p_nodes);
    v_ready timestamptz := greatest(v_now, coalesce(p_start_at, v_now));
    v_key   record;
BEGIN
    IF p_submit_key IS NOT NULL THEN
        p_run_id := cyclone.submit_key_id(p_workflow, p_submit_key);
        -- A concurrent SubmitOnce with the same key waits here for the first to end.
        INSERT INTO cyclone.submit_keys (key_id, workflow, submit_key, run_id, created_at)
        VALUES (p_run_id, p_workflow, p_submit_key, p_run_id, v_now)
        ON CONFLICT (key_id) DO NOTHING;
        IF NOT FOUND THEN
            SELECT k.run_id, k.workflow, k.submit_key INTO v_key FROM cyclone.submit_keys k
             WHERE k.key_id = p_run_id;
            -- Two keys with one SHA-256 prefix: refused rather than answered wrongly.
            IF v_key.workflow <> p_workflow OR v_key.submit_key <> p_submit_key THEN
                RAISE EXCEPTION 'submit key % of workflow % has the id of another key',
                    p_submit_key, p_workflow USING ERRCODE = 'CY004';
            END IF;
            run_id := v_key.run_id;
            created := false;
            RETURN;
        END IF;
    END IF;

    INSERT INTO cyclone.runs (run_id, workflow, submit_key, status, input, steps_total,
                              steps_open, created_at, updated_at, priority, start_at)
    VALUES (p_run_id, p_workflow, p_submit_key, 'running', p_input, v_count, v_count,
            v_now, v_now, coalesce(p_priority, 0), p_start_at);

    INSERT INTO cyclone.steps (run_id, node, position, action, status, trigger_rule, depends_on,
                               dependents, deps_open, max_attempts, attempt_budget,
                               initial_backoff, max_backoff, backoff_multiplier, timeout,
                               input, available_at, priority, concurrency_key,
                               concurrency_limit)
    SELECT p_run_id, n.name, n.position, n.action,
           CASE WHEN cardinality(n.depends_on) = 0 THEN 'available' ELSE 'pending' END,
           n.trigger_rule, n.depends_on, n.dependents, cardinality(n.depends_on),
           n.max_attempts, n.max_attempts, make_interval(secs => n.initial_backoff_s),
           make_interval(secs => n.max_backoff_s), n.backoff_multiplier,
           make_interval(secs => n.timeout_s), n.input,
           CASE WHEN cardinality(n.depends_on) = 0 THEN v_ready END,
           coalesce(n.priority, p_priority, 0), n.concurrency_key, n.concurrency_limit
      FROM jsonb_to_recordset(p_nodes) AS n(
               name text, position integer, action text, depends_on text[], dependents text[],
               trigger_rule text, max_attempts integer, initial_backoff_s float8,
               max_backoff_s float8, backoff_multiplier float8, timeout_s float8, input jsonb,
               priority integer, concurrency_key text, concurrency_limit integer);

    -- Also for a run that starts later: a waiting claim that wakes for nothing sets
    -- its timer by the earliest available_at (step_next_due), now the start time.
    PERFORM cyclone._notify_ready(array_agg(e.node->>'action'))
       FROM jsonb_array_elements(p_nodes) e(node)
      WHERE jsonb_array_length(e.node->'depends_on') = 0;
    run_id := p_run_id;
    created := true;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone.submit_keys_purge(p_age interval, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    DELETE FROM cyclone.submit_keys k
     WHERE k.key_id IN (
           SELECT o.key_id FROM cyclone.submit_keys o
            WHERE o.created_at < cyclone.now() - p_age
              AND NOT EXISTS (SELECT 1 FROM cyclone.runs r WHERE r.run_id = o.run_id)
            ORDER BY o.created_at
            LIMIT p_limit
              FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

-- Statements Citus can route to one shard. On a Citus coordinator each statement of a
-- transition is planned on its own and sent to the shard of its run: SQL-language
-- functions with parameters cannot be (so _run_block and _run_cancel_one become
-- PL/pgSQL), and an UPDATE of a distributed table may call no volatile
-- function, nor a STABLE one on its columns (so step_fail's backoff takes its jitter
-- from a variable, and adds it to the time with _later); an INSERT may hold no
-- subquery (step_retry's audit entry), nor a simple CASE on a parameter (step_wait's,
-- which Citus sends as a comparison of text with boolean); a lock is taken on one shard at a time
-- (run_cancel locks the descendants one by one, in the same order). Same results on
-- one Postgres.
DROP FUNCTION cyclone._backoff(interval, interval, float8, integer);

CREATE FUNCTION cyclone._backoff(
    p_initial interval, p_max interval, p_multiplier float8, p_attempt integer,
    p_jitter float8)
RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT d * (1 - p_jitter / 2)
      FROM (SELECT least(p_max, p_initial * power(p_multiplier, least(p_attempt - 1, 60)))) b(d)
$$;

CREATE FUNCTION cyclone._later(p_at timestamptz, p_by interval) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_at + p_by
$$;

CREATE OR REPLACE FUNCTION cyclone._run_block(p_run_id uuid, p_error jsonb, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_workflow text;
BEGIN
    UPDATE cyclone.steps s SET status = 'pending', available_at = NULL
     WHERE s.run_id = p_run_id AND s.status = 'available';
    UPDATE cyclone.runs r SET status = 'blocked', updated_at = p_now, error = p_error
     WHERE r.run_id = p_run_id
    RETURNING r.workflow INTO v_workflow;
    RETURN v_workflow;
END;
$$;

CREATE OR REPLACE FUNCTION cyclone._run_cancel_one(p_run_id uuid, p_actor text, p_reason text,
                                        p_details jsonb, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cyclone.steps s SET status = 'cancelled', finished_at = p_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.status IN ('pending', 'available', 'running', 'uncertain');
    UPDATE cyclone.runs r
       SET status = 'cancelled', steps_open = 0, error = NULL, finished_at = p_now,
           updated_at = p_now
     WHERE r.run_id = p_run_id;
    INSERT INTO cyclone.audit (run_id, action, actor, reason, details, at)
    VALUES (p_run_id, 'cancel', p_actor, p_reason, p_details, p_now);
END;
$$;

CREATE OR REPLACE FUNCTION cyclone._step_fail_unheld(
    p_run_id uuid, p_node text, p_lease_token uuid, p_type text, p_message text,
    p_details text, p_retryable boolean, p_retry_after interval)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
    v_jitter float8 := random();
BEGIN
    UPDATE cyclone.steps s
       SET status = CASE WHEN p_retryable AND s.attempt - s.resumes < s.max_attempts
                         THEN 'available' ELSE 'discarded' END,
           available_at = CASE WHEN p_retryable AND s.attempt - s.resumes < s.max_attempts
                               THEN cyclone._later(v_now, coalesce(
                                        p_retry_after,
                                        cyclone._backoff(s.initial_backoff, s.max_backoff,
                                                         s.backoff_multiplier,
                                                         s.attempt - s.resumes, v_jitter)))
                          END,
           finished_at = CASE WHEN p_retryable AND s.attempt - s.resumes < s.max_attempts
                              THEN NULL ELSE v_now END,
           lease_expires_at = NULL, waiting_for = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.lease_token = p_lease_token
       -- By key: see steps_leased_idx.
       AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
    RETURNING s.status, s.attempt, s.action, s.available_at,
              s.concurrency_key IS NOT NULL AS keyed INTO v_step;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                v_step.lease_token, v_step.attempt);
    END IF;
    INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, details,
                                     retryable, at)
    VALUES (p_run_id, p_node, v_step.attempt, 'handler', coalesce(p_type, ''),
            coalesce(p_message, ''), coalesce(p_details, ''), v_step.status = 'available',
            v_now);
    IF v_step.status = 'discarded' THEN
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], '{}', 1);
    END IF;
    -- A retry is ready (now or later); a discarded step frees a slot of its
    -- concurrency key: either way the claims of its action look again.
    IF v_step.status = 'available' OR v_step.keyed THEN
        PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
    END IF;
    RETURN ROW(v_step.status, (SELECT r.status FROM cyclone.runs r WHERE r.run_id = p_run_id),
               false, v_step.available_at)::cyclone.completion;
END;
$$;

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
           max_attempts = s.attempt - s.resumes + s.attempt_budget,
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

CREATE OR REPLACE FUNCTION cyclone.run_cancel(p_run_id uuid, p_actor text, p_reason text,
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

CREATE OR REPLACE FUNCTION cyclone.step_wait(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_function text, p_wake_at timestamptz, p_event text, p_timeout interval,
    p_child uuid)
RETURNS TABLE (decision text, call jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_status  text;
    v_attempt integer;
    v_for     text;
    v_call    cyclone.step_calls;
    v_outcome jsonb;
    v_payload jsonb;
    v_action  text;
BEGIN
    PERFORM cyclone._step_call_check(p_step_id, p_seq, p_function);
    IF p_function = 'cyclone.sleep' THEN
        IF p_wake_at IS NULL OR NOT isfinite(p_wake_at) THEN
            RAISE EXCEPTION 'a sleep needs a finite wake time' USING ERRCODE = 'CY004';
        END IF;
        v_for := 'sleep';
    ELSIF p_function = 'cyclone.event' THEN
        PERFORM cyclone._event_text_check(p_event, 'an event name');
        IF p_timeout IS NOT NULL
           AND (p_timeout < interval '1 millisecond' OR p_timeout > interval '366 days') THEN
            RAISE EXCEPTION 'an event timeout must be between 1ms and 366 days, got %',
                p_timeout USING ERRCODE = 'CY004';
        END IF;
        v_for := 'event ' || p_event;
    ELSIF p_function = 'cyclone.child' THEN
        IF p_child IS NULL THEN
            RAISE EXCEPTION 'a child wait needs the child''s run_id' USING ERRCODE = 'CY004';
        END IF;
        v_for := 'child ' || p_child;
    ELSE
        RAISE EXCEPTION 'a wait''s function is cyclone.sleep, cyclone.event or cyclone.child'
            USING ERRCODE = 'CY004';
    END IF;

    v_status := cyclone._run_lock(p_run_id);
    v_attempt := cyclone._step_held(p_run_id, p_node, p_lease_token, true);
    SELECT * INTO v_call FROM cyclone.step_calls c
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id;
    IF FOUND THEN
        IF v_call.function <> p_function OR v_call.waiting_for IS DISTINCT FROM v_for THEN
            RAISE EXCEPTION 'step call % of node % is recorded as % (%), not as this wait (%)',
                p_step_id, p_node, v_call.function, coalesce(v_call.waiting_for, 'no wait'),
                v_for USING ERRCODE = 'CY004';
        END IF;
        IF v_call.status <> 'waiting' THEN
            RETURN QUERY SELECT 'ready', cyclone._step_call_json(v_call);
            RETURN;
        END IF;
    ELSE
        PERFORM cyclone._step_call_room(p_run_id, p_node);
        INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                             unsafe, attempt, started_at, wake_at,
                                             waiting_for)
        VALUES (p_run_id, p_node, p_step_id, p_seq, p_function, 'waiting', false, v_attempt,
                -- Searched, not simple, CASE: Citus sends the simple form to the shard
                -- as a comparison of text with boolean.
                v_now, CASE WHEN p_function = 'cyclone.sleep' THEN p_wake_at
                            WHEN p_function = 'cyclone.event' THEN v_now + p_timeout END,
                v_for)
        RETURNING c.* INTO v_call;
    END IF;

    IF p_function = 'cyclone.sleep' THEN
        IF v_call.wake_at <= v_now THEN
            v_outcome := jsonb_build_object('output', 'null'::jsonb);
        END IF;
    ELSIF p_function = 'cyclone.event' THEN
        UPDATE cyclone.events e
           SET consumed_at = v_now, consumed_node = p_node, consumed_step_id = p_step_id
         WHERE e.run_id = p_run_id
           AND e.event_id = (SELECT o.event_id FROM cyclone.events o
                              WHERE o.run_id = p_run_id AND o.name = p_event
                                AND o.consumed_at IS NULL
                              ORDER BY o.event_id LIMIT 1)
        RETURNING e.payload INTO v_payload;
        IF FOUND THEN
            v_outcome := jsonb_build_object('output', v_payload);
        ELSIF v_call.wake_at <= v_now THEN
            v_outcome := jsonb_build_object('error', jsonb_build_object(
                'type', 'EventTimeout',
                'message', format('no event %s came within %s', p_event,
                                  v_call.wake_at - v_call.started_at),
                'details', ''));
        END IF;
    ELSE
        v_outcome := cyclone._wait_child(p_run_id, p_node, p_step_id, p_child);
    END IF;

    IF v_outcome IS NOT NULL THEN
        UPDATE cyclone.step_calls c
           SET status = CASE WHEN v_outcome ? 'error' THEN 'failed' ELSE 'succeeded' END,
               output = v_outcome->'output', error = v_outcome->'error', attempt = v_attempt,
               finished_at = v_now
         WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id
        RETURNING c.* INTO v_call;
        UPDATE cyclone.steps s SET waiting_for = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.waiting_for IS NOT NULL;
        RETURN QUERY SELECT 'ready', cyclone._step_call_json(v_call);
        RETURN;
    END IF;

    UPDATE cyclone.steps s
       SET status = CASE WHEN v_status = 'running' THEN 'available' ELSE 'pending' END,
           available_at = CASE WHEN v_status = 'running'
                               THEN coalesce(v_call.wake_at, cyclone._wait_forever()) END,
           lease_token = NULL, lease_expires_at = NULL, resumes = s.resumes + 1,
           waiting_for = v_for
     WHERE s.run_id = p_run_id AND s.node = p_node
    RETURNING s.action INTO v_action;
    IF v_status = 'running' THEN
        PERFORM cyclone._notify_ready(ARRAY[v_action]);
    END IF;
    RETURN QUERY SELECT 'suspended', cyclone._step_call_json(v_call);
END;
$$;
