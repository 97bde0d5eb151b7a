-- Fewer statements per completion. Each statement a PL/pgSQL function runs costs about
-- as much as the row work it does, and the hot path ran a dozen. A completed step
-- with no dependents now costs three (lock the run, complete the step, close the run
-- by one), and closing a run is one statement that looks for a discarded step only
-- when the run is finishing.

-- Counts p_closed more steps of a locked run as final; when none is left open, the run
-- is completed, or failed by its first discarded step. Returns the run's status.
CREATE FUNCTION cyclone._run_close(p_run_id uuid, p_closed integer, p_now timestamptz)
RETURNS text
LANGUAGE sql AS $$
    UPDATE cyclone.runs r
       SET steps_open = r.steps_open - p_closed,
           updated_at = p_now,
           status = CASE
               WHEN r.steps_open > p_closed OR r.status <> 'running' THEN r.status
               WHEN EXISTS (SELECT 1 FROM cyclone.steps s
                             WHERE s.run_id = p_run_id AND s.status = 'discarded')
               THEN 'failed'
               ELSE 'completed' END,
           finished_at = CASE
               WHEN r.steps_open > p_closed OR r.status <> 'running' THEN r.finished_at
               ELSE p_now END,
           error = CASE
               WHEN r.steps_open > p_closed OR r.status <> 'running' THEN r.error
               ELSE (SELECT jsonb_build_object(
                                'kind', 'StepDiscarded',
                                'message', format('node %s was discarded at attempt %s',
                                                  s.node, s.attempt),
                                'node', s.node, 'attempt', s.attempt,
                                'started_at', s.started_at)
                       FROM cyclone.steps s
                      WHERE s.run_id = p_run_id AND s.status = 'discarded'
                      ORDER BY s.finished_at, s.node LIMIT 1) END
     WHERE r.run_id = p_run_id
    RETURNING r.status
$$;

-- Same contract as in 0002, now returning the run's status after it; the run's
-- bookkeeping is _run_close.
DROP FUNCTION cyclone._settle(uuid, text[], text[], integer);
CREATE FUNCTION cyclone._settle(p_run_id uuid, p_final text[], p_decide text[], p_closed integer)
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now        timestamptz := cyclone.now();
    v_queue      text[] := p_final;
    v_decide     text[] := p_decide;
    v_ready      text[] := '{}';
    v_closed     integer := p_closed;
    v_dependents text[];
    v_failed     boolean;
    v_step       record;
    v_status     text;
BEGIN
    LOOP
        IF cardinality(v_decide) > 0 THEN
            -- Judge the pending steps whose upstream is all final.
            FOR v_step IN
                SELECT node, trigger_rule, deps_failed FROM cyclone.steps
                 WHERE run_id = p_run_id AND node = ANY (v_decide)
                   AND status = 'pending' AND deps_open = 0
            LOOP
                IF (CASE v_step.trigger_rule
                        WHEN 'all_success' THEN v_step.deps_failed = 0
                        WHEN 'all_done' THEN true
                        ELSE v_step.deps_failed > 0
                    END)
                THEN
                    v_ready := v_ready || v_step.node;
                ELSE
                    UPDATE cyclone.steps SET status = 'skipped', finished_at = v_now
                     WHERE run_id = p_run_id AND node = v_step.node AND status = 'pending';
                    v_queue := v_queue || v_step.node;
                    v_closed := v_closed + 1;
                END IF;
            END LOOP;
            v_decide := '{}';
        END IF;
        EXIT WHEN cardinality(v_queue) = 0;

        -- Take one final step off the queue and count it at each pending dependent.
        SELECT dependents, status <> 'completed' INTO v_dependents, v_failed
          FROM cyclone.steps WHERE run_id = p_run_id AND node = v_queue[1];
        v_queue := v_queue[2:];
        CONTINUE WHEN cardinality(v_dependents) = 0;
        WITH counted AS (
            UPDATE cyclone.steps
               SET deps_open = deps_open - 1, deps_failed = deps_failed + v_failed::integer
             WHERE run_id = p_run_id AND node = ANY (v_dependents) AND status = 'pending'
            RETURNING node, deps_open
        )
        SELECT coalesce(array_agg(node), '{}') INTO v_decide FROM counted WHERE deps_open = 0;
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

-- As in 0002, with the run's status taken from _settle, and a step with no
-- dependents closed without walking the graph.
CREATE OR REPLACE FUNCTION cyclone.step_complete(
    p_run_id uuid, p_node text, p_lease_token uuid, p_output jsonb)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
