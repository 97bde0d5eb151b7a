-- Runs are listed and counted by their tags, through a row per tag in cyclone.run_tags
-- (filled from runs.tags here, then by run_submit), and an operator may change a run's
-- tags (run_tags_set, audited).
CREATE TABLE cyclone.run_tags (
    run_id     uuid        NOT NULL REFERENCES cyclone.runs ON DELETE CASCADE,
    key        text        NOT NULL,
    value      text        NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX run_tags_idx ON cyclone.run_tags (key, value, created_at DESC, run_id DESC);

INSERT INTO cyclone.run_tags (run_id, key, value, created_at)
SELECT r.run_id, t.key, t.value, r.created_at
  FROM cyclone.runs r, jsonb_each_text(r.tags) t
 WHERE r.tags IS NOT NULL;

CREATE OR REPLACE FUNCTION cyclone.run_submit(
    p_run_id uuid, p_workflow text, p_submit_key text, p_input jsonb, p_nodes jsonb,
    p_start_at timestamptz DEFAULT NULL, p_priority integer DEFAULT 0,
    p_tags jsonb DEFAULT NULL, p_deadline timestamptz DEFAULT NULL,
    p_traceparent text DEFAULT NULL,
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
                              steps_open, created_at, updated_at, priority, start_at, tags,
                              deadline, traceparent)
    VALUES (p_run_id, p_workflow, p_submit_key, 'running', p_input, v_count, v_count,
            v_now, v_now, coalesce(p_priority, 0), p_start_at, p_tags, p_deadline,
            p_traceparent);
    IF p_tags IS NOT NULL THEN
        INSERT INTO cyclone.run_tags (run_id, key, value, created_at)
        SELECT p_run_id, t.key, t.value, v_now FROM jsonb_each_text(p_tags) t;
    END IF;

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
