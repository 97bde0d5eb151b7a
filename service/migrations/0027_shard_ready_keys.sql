-- Shard-ready keys (issue 21): every unique constraint contains run_id, so that the
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
