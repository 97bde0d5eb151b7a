-- _settle's lookups of a run's steps by key (docs/performance.md, "Wide fan-outs").
--
-- _settle found a run's steps with run_id = p_run_id AND node = ANY (list). With
-- statistics of small runs (a history of one-node runs, analyzed), PostgreSQL 15 and 16
-- plan that generically as an index scan by run_id alone, the list a filter: each
-- batch of a fan-out's leaves read all the steps of the run twice, for the leaves'
-- dependents and for the count at the join. Now the finals' dependents are read one
-- probe of the key per final (a lateral lookup, as step_claim's upstream since 0041),
-- and every other lookup by a list also says that the name is between the list's first
-- and last in the key's byte order, which those planners always put in the index
-- condition: exact for the join (a list of one), never wider than the run. Every
-- statement still names run_id, as Citus needs to route it. Everything else is as it
-- was.

CREATE OR REPLACE FUNCTION cyclone._settle(p_run_id uuid, p_final text[], p_decide text[], p_closed integer,
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
    -- The first and the last name of the list a statement looks up (byte order, as the
    -- primary key): every lookup by a list also names this range of the key. Before
    -- PostgreSQL 17 a generic plan may leave node = ANY (list) out of the index
    -- condition when the statistics say a run has a step or two, and read every step of
    -- the run for it (10,000 per count at a fan-out's join); a range of the key's second
    -- column is always in it.
    v_lo       text COLLATE "C";
    v_hi       text COLLATE "C";
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
                -- The finals one probe of the key each (OFFSET 0 keeps the lookup a
                -- lateral probe): their names are any set, so no range of the key
                -- holds them alone.
                SELECT array_agg(fin.node),
                       jsonb_object_agg(fin.node, jsonb_build_array(fin.n, fin.failed)),
                       NULL, NULL
                  INTO v_targets, v_counts, v_one, v_one_failed
                  FROM (SELECT d.node, count(*)::integer AS n,
                               (count(*) FILTER (WHERE f.status <> 'completed'))::integer
                                   AS failed
                          FROM (SELECT DISTINCT x FROM unnest(v_wave) x) w(node)
                         CROSS JOIN LATERAL (SELECT f.status, f.dependents FROM cyclone.steps f
                                              WHERE f.run_id = p_run_id AND f.node = w.node
                                             OFFSET 0) f
                         CROSS JOIN LATERAL unnest(f.dependents) AS d(node)
                         GROUP BY d.node) fin;
            END IF;
            -- No dependents, no count (on Citus an empty range is no shard at all).
            IF cardinality(v_targets) > 0 THEN
                SELECT min(x COLLATE "C"), max(x COLLATE "C") INTO v_lo, v_hi
                  FROM unnest(v_targets) x;
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
                       AND s.node BETWEEN v_lo AND v_hi
                       AND s.status = 'pending'
                    RETURNING s.node, s.deps_open, s.status, s.action
                )
                SELECT v_decide || coalesce(array_agg(node) FILTER (WHERE status = 'pending'), '{}'),
                       v_actions || coalesce(array_agg(action) FILTER (WHERE status = 'available'),
                                             '{}')
                  INTO v_decide, v_actions
                  FROM counted WHERE deps_open = 0;
            END IF;
            v_from := NULL;
        END IF;
        EXIT WHEN cardinality(v_decide) = 0;

        -- Judge the pending steps whose upstream is all final.
        SELECT min(x COLLATE "C"), max(x COLLATE "C") INTO v_lo, v_hi FROM unnest(v_decide) x;
        WITH judged AS (
            -- A node with no upstream always runs, whatever its rule, as at submit
            -- (it is judged here when released after Resolve or reset by Retry).
            SELECT node, cardinality(depends_on) = 0
                         OR cyclone._rule_met(trigger_rule, deps_failed) AS runs
              FROM cyclone.steps
             WHERE run_id = p_run_id AND node = ANY (v_decide) AND node BETWEEN v_lo AND v_hi
               AND status = 'pending' AND deps_open = 0
        ), skipped AS (
            UPDATE cyclone.steps s SET status = 'skipped', finished_at = v_now
             WHERE s.run_id = p_run_id
               AND s.node = ANY (ARRAY(SELECT j.node FROM judged j WHERE NOT j.runs))
               AND s.node BETWEEN v_lo AND v_hi
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
        SELECT min(x COLLATE "C"), max(x COLLATE "C") INTO v_lo, v_hi FROM unnest(v_ready) x;
        WITH released AS (
            UPDATE cyclone.steps SET status = 'available', available_at = v_now
             WHERE run_id = p_run_id AND node = ANY (v_ready) AND node BETWEEN v_lo AND v_hi
               AND status = 'pending'
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
