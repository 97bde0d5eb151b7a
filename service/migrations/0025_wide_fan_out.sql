-- A wide fan-out settles in linear time, and a released step is written once (the
-- bench's fan scenario).
--
-- _settle counted a wave of finals at their dependents by joining the run's steps to
-- the set of counts. A planner that expects a run to hold a few steps (no statistics,
-- or statistics of many small runs) put the run's pending steps outside the join and
-- the counts inside: completing the root of a 10,000-wide fan-out compared every
-- pending step with every count, 15 s (past the server's statement timeout under
-- load). The counts are now gathered first and the dependents updated by key
-- (node = ANY of a list), each looking its count up by name; the skipped steps are
-- updated by key too.
--
-- A dependent that the count leaves ready in a running run is made available by the
-- counting update itself, instead of a second update of the same row (one row version,
-- its index entries and WAL less per released step). The trigger rule is one function,
-- _rule_met, for both places that judge it. Same transitions, same locks.
CREATE FUNCTION cyclone._rule_met(p_rule text, p_failed integer) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_rule
               WHEN 'all_success' THEN p_failed = 0
               WHEN 'all_done' THEN true
               ELSE p_failed > 0
           END
$$;

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
    -- The wave's dependents, and for each its count of finals and of failed finals.
    v_targets  text[];
    v_counts   jsonb;
BEGIN
    v_running := (SELECT r.status = 'running' FROM cyclone.runs r WHERE r.run_id = p_run_id);
    LOOP
        IF cardinality(v_wave) > 0 THEN
            -- Count the whole wave at each pending dependent: the counts first, then
            -- the dependents updated by key, each looking its count up by name. One
            -- left with no open upstream is released here when its rule is met and the
            -- run is running; the others left with none are judged below.
            SELECT array_agg(fin.node),
                   jsonb_object_agg(fin.node, jsonb_build_array(fin.n, fin.failed))
              INTO v_targets, v_counts
              FROM (SELECT d.node, count(*)::integer AS n,
                           (count(*) FILTER (WHERE f.status <> 'completed'))::integer AS failed
                      FROM cyclone.steps f CROSS JOIN LATERAL unnest(f.dependents) AS d(node)
                     WHERE f.run_id = p_run_id AND f.node = ANY (v_wave)
                     GROUP BY d.node) fin;
            WITH counted AS (
                UPDATE cyclone.steps s
                   SET deps_open = s.deps_open - (v_counts->s.node->>0)::integer,
                       deps_failed = s.deps_failed + (v_counts->s.node->>1)::integer,
                       status = CASE
                           WHEN v_running AND s.deps_open = (v_counts->s.node->>0)::integer
                                AND cyclone._rule_met(s.trigger_rule, s.deps_failed
                                                      + (v_counts->s.node->>1)::integer)
                           THEN 'available' ELSE s.status END,
                       available_at = CASE
                           WHEN v_running AND s.deps_open = (v_counts->s.node->>0)::integer
                                AND cyclone._rule_met(s.trigger_rule, s.deps_failed
                                                      + (v_counts->s.node->>1)::integer)
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
