-- A wide release in chunks (docs/performance.md, "Wide fan-outs").
--
-- A node that becomes final alone with more than 1,000 dependents (a fan-out's root)
-- is counted at its first 1,000 dependents in its own transaction; the rest are left
-- in cyclone.releases and counted 1,000 per transaction by release_continue, which the
-- servers run as soon as that commits. The first leaves can so be claimed while the
-- others are counted, where a fan-out of 10,000 was one 80 ms transaction before any
-- leaf could be claimed. step_retry, which counts from the graph, finishes a run's
-- release first. _settle takes one more argument (p_from), so it is made again.

CREATE TABLE cyclone.releases (
    run_id     uuid        PRIMARY KEY,
    node       text        NOT NULL,
    next       integer     NOT NULL CHECK (next > 1),
    created_at timestamptz NOT NULL,
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE
);


DROP FUNCTION cyclone._settle(uuid, text[], text[], integer);

CREATE FUNCTION cyclone._settle(p_run_id uuid, p_final text[], p_decide text[], p_closed integer,
                                p_from integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := cyclone.now();
    v_wave     text[] := p_final;
    v_decide   text[] := p_decide;
    v_ready    text[] := '{}';
    v_runs     text[];
    v_closed   integer := p_closed;
    v_running  boolean;
    -- The actions of the steps made available, for _notify_ready.
    v_actions  text[] := '{}';
    -- The wave's dependents, and for each its count of finals and of failed finals:
    -- by name in v_counts, or, for a wave of one final, the same for every dependent
    -- (one, and whether that final failed) in v_one and v_one_failed.
    v_targets  text[];
    v_counts   jsonb;
    v_one      integer;
    v_one_failed integer;
    -- Dependents counted in one transaction, at most, for a wave of one final; and
    -- p_from, for the first wave only.
    c_chunk    constant integer := 1000;
    v_from     integer := p_from;
BEGIN
    v_running := (SELECT r.status = 'running' FROM cyclone.runs r WHERE r.run_id = p_run_id);
    LOOP
        IF cardinality(v_wave) > 0 THEN
            -- Count the whole wave at each pending dependent: the counts first, then
            -- the dependents updated by key, each looking its count up by name. One
            -- left with no open upstream is released here when its rule is met and the
            -- run is running; the others left with none are judged below.
            IF cardinality(v_wave) = 1 THEN
                -- One final (a root's completion, the wave of a single failure): each
                -- of its dependents counts it once, so no count is looked up by name.
                -- For a fan-out of 10,000 the lookups were a third of the release
                -- (docs/performance.md, "Wide fan-outs").
                SELECT f.dependents, 1, (f.status <> 'completed')::integer
                  INTO v_targets, v_one, v_one_failed
                  FROM cyclone.steps f WHERE f.run_id = p_run_id AND f.node = v_wave[1];
                IF v_from IS NOT NULL THEN
                    -- The next chunk of a release in progress; its row is the last
                    -- when no dependent is left after it.
                    IF v_from + c_chunk > cardinality(v_targets) THEN
                        DELETE FROM cyclone.releases x WHERE x.run_id = p_run_id;
                    ELSE
                        UPDATE cyclone.releases x SET next = v_from + c_chunk
                         WHERE x.run_id = p_run_id;
                    END IF;
                    v_targets := v_targets[v_from : v_from + c_chunk - 1];
                ELSIF cardinality(v_targets) > c_chunk
                      AND NOT EXISTS (SELECT 1 FROM cyclone.releases x
                                       WHERE x.run_id = p_run_id) THEN
                    -- A release in chunks: the first now, the others by release_continue,
                    -- which the servers run as soon as this commits (woken by the name
                    -- cyclone.release, which no action has).
                    INSERT INTO cyclone.releases (run_id, node, next, created_at)
                    VALUES (p_run_id, v_wave[1], c_chunk + 1, v_now);
                    v_targets := v_targets[1:c_chunk];
                    v_actions := v_actions || 'cyclone.release'::text;
                END IF;
            ELSE
                SELECT array_agg(fin.node),
                       jsonb_object_agg(fin.node, jsonb_build_array(fin.n, fin.failed)),
                       NULL, NULL
                  INTO v_targets, v_counts, v_one, v_one_failed
                  FROM (SELECT d.node, count(*)::integer AS n,
                               (count(*) FILTER (WHERE f.status <> 'completed'))::integer
                                   AS failed
                          FROM cyclone.steps f
                         CROSS JOIN LATERAL unnest(f.dependents) AS d(node)
                         WHERE f.run_id = p_run_id AND f.node = ANY (v_wave)
                         GROUP BY d.node) fin;
            END IF;
            -- coalesce evaluates the lookup by name only when there is no v_one.
            WITH counted AS (
                UPDATE cyclone.steps s
                   SET deps_open = s.deps_open
                                   - coalesce(v_one, (v_counts->s.node->>0)::integer),
                       deps_failed = s.deps_failed
                                     + coalesce(v_one_failed, (v_counts->s.node->>1)::integer),
                       status = CASE
                           WHEN v_running
                                AND s.deps_open = coalesce(v_one,
                                                           (v_counts->s.node->>0)::integer)
                                AND cyclone._rule_met(s.trigger_rule, s.deps_failed
                                        + coalesce(v_one_failed,
                                                   (v_counts->s.node->>1)::integer))
                           THEN 'available' ELSE s.status END,
                       available_at = CASE
                           WHEN v_running
                                AND s.deps_open = coalesce(v_one,
                                                           (v_counts->s.node->>0)::integer)
                                AND cyclone._rule_met(s.trigger_rule, s.deps_failed
                                        + coalesce(v_one_failed,
                                                   (v_counts->s.node->>1)::integer))
                           THEN v_now ELSE s.available_at END
                 WHERE s.run_id = p_run_id AND s.node = ANY (v_targets)
                   AND s.status = 'pending'
                RETURNING s.node, s.deps_open, s.status, s.action
            )
            SELECT v_decide || coalesce(array_agg(node) FILTER (WHERE status = 'pending'), '{}'),
                   v_actions || coalesce(array_agg(action) FILTER (WHERE status = 'available'),
                                         '{}')
              INTO v_decide, v_actions
              FROM counted WHERE deps_open = 0;
            v_from := NULL;
        END IF;
        EXIT WHEN cardinality(v_decide) = 0;

        -- Judge the pending steps whose upstream is all final.
        WITH judged AS (
            -- A node with no upstream always runs, whatever its rule, as at submit
            -- (it is judged here when released after Resolve or reset by Retry).
            SELECT node, cardinality(depends_on) = 0
                         OR cyclone._rule_met(trigger_rule, deps_failed) AS runs
              FROM cyclone.steps
             WHERE run_id = p_run_id AND node = ANY (v_decide)
               AND status = 'pending' AND deps_open = 0
        ), skipped AS (
            UPDATE cyclone.steps s SET status = 'skipped', finished_at = v_now
             WHERE s.run_id = p_run_id
               AND s.node = ANY (ARRAY(SELECT j.node FROM judged j WHERE NOT j.runs))
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

    IF cardinality(v_ready) > 0 AND v_running THEN
        WITH released AS (
            UPDATE cyclone.steps SET status = 'available', available_at = v_now
             WHERE run_id = p_run_id AND node = ANY (v_ready) AND status = 'pending'
            RETURNING action)
        SELECT v_actions || coalesce(array_agg(action), '{}') INTO v_actions FROM released;
    END IF;
    PERFORM cyclone._notify_ready(v_actions);
    IF v_closed = 0 THEN
        RETURN (SELECT status FROM cyclone.runs WHERE run_id = p_run_id);
    END IF;
    RETURN cyclone._run_close(p_run_id, v_closed, v_now);
END;
$$;


CREATE FUNCTION cyclone.release_continue(p_run_id uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
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


CREATE FUNCTION cyclone._release_finish(p_run_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WHILE cyclone.release_continue(p_run_id) LOOP
    END LOOP;
END;
$$;


CREATE FUNCTION cyclone.releases_pending(p_limit integer) RETURNS SETOF uuid
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT x.run_id FROM cyclone.releases x ORDER BY x.created_at LIMIT p_limit;
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
