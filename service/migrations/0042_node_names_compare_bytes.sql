-- Node names compare byte by byte (docs/performance.md, "The engine's SQL").
--
-- All steps of a run share its run_id, so within a run the primary key (run_id, node)
-- orders them by name, and each comparison of two names went through the database's
-- collation: strcoll() for any libc locale but "C" (C.UTF-8, the embedded default,
-- included). Counted by callgrind, that was about 18,000 instructions per step of a
-- fan-out (its release, claim and completion each look a leaf up among 10,000 names),
-- and one-node runs paid nothing, their names being equal when compared. Names are
-- identifiers: their order needs no language, so every column that holds a node name
-- of a step key, and the step calls' ids beside them, now use COLLATE "C". For UTF-8
-- that is the order of code points, which is also C.UTF-8's.
--
-- Only the collation changes, so no table is rewritten; the indexes on these columns
-- and the foreign keys to steps are built again. The referencing tables go first, so
-- that each foreign key is rebuilt once, between columns of the same collation.

ALTER TABLE cyclone.step_errors ALTER COLUMN node TYPE text COLLATE "C";
ALTER TABLE cyclone.step_logs ALTER COLUMN node TYPE text COLLATE "C";
ALTER TABLE cyclone.releases ALTER COLUMN node TYPE text COLLATE "C";
ALTER TABLE cyclone.step_calls
    ALTER COLUMN node TYPE text COLLATE "C",
    ALTER COLUMN step_id TYPE text COLLATE "C";
ALTER TABLE cyclone.steps
    ALTER COLUMN node TYPE text COLLATE "C",
    ALTER COLUMN depends_on TYPE text[] COLLATE "C",
    ALTER COLUMN dependents TYPE text[] COLLATE "C";

-- step_retry's walk down from the retried nodes is a recursive query: its first term (the
-- nodes given, text in the default collation) must have the collation of the steps' names
-- that its recursive term adds. Everything else is as it was.
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
