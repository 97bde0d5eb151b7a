-- The release of a wide fan-out, cheaper (docs/performance.md, "Wide fan-outs").
--
-- _settle counts a wave of one final (a root's completion) without looking each
-- dependent's count up by name: every dependent counts that final once. For a
-- fan-out of 10,000 the lookups in a jsonb map of 10,000 counts were a third of the
-- root's completion. Waves of several finals are counted as before.
CREATE OR REPLACE FUNCTION cyclone._settle(p_run_id uuid, p_final text[], p_decide text[], p_closed integer)
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
