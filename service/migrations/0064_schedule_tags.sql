-- Schedules carry tags that each run they submit takes.

ALTER TABLE cyclone.schedules ADD COLUMN tags jsonb;

-- Fires one schedule, which the caller has locked (FOR UPDATE, in the same
-- transaction): submits a run for each of p_fire_times (ascending, none before the
-- schedule's next_fire_at) with the run id of the same rank in p_run_ids, then moves
-- next_fire_at to p_next_fire_at (after the last of them). With overlap 'skip', a
-- firing while the last run is running or blocked submits nothing. Fire times the
-- caller skipped as missed are simply not passed. One row per fire time: its key,
-- the run (NULL when skipped) and the outcome: 'submitted', 'existing' (the key had
-- its run already) or 'overlap'. Nothing when the schedule is gone or paused.
-- Raises CY004 for fire times that would not move the schedule forward.
CREATE OR REPLACE FUNCTION cyclone.schedule_fire(p_name text, p_fire_times timestamptz[],
                                      p_run_ids uuid[], p_next_fire_at timestamptz)
RETURNS TABLE (fire_at timestamptz, submit_key text, run_id uuid, outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_s       cyclone.schedules;
    v_n       integer := coalesce(cardinality(p_fire_times), 0);
    v_open    boolean;
    v_created boolean;
BEGIN
    SELECT * INTO v_s FROM cyclone.schedules s WHERE s.name = p_name FOR UPDATE;
    IF NOT FOUND OR v_s.paused THEN
        RETURN;
    END IF;
    IF v_n <> coalesce(cardinality(p_run_ids), 0)
       OR (v_n > 0 AND (p_fire_times[1] < v_s.next_fire_at
                        OR p_next_fire_at <= p_fire_times[v_n]))
       OR p_next_fire_at <= v_s.next_fire_at
       OR EXISTS (SELECT 1 FROM generate_series(2, v_n) g(i)
                   WHERE p_fire_times[g.i] <= p_fire_times[g.i - 1]) THEN
        RAISE EXCEPTION 'schedule %: fire times % and next %, from next %, do not go forward',
            p_name, p_fire_times, p_next_fire_at, v_s.next_fire_at
            USING ERRCODE = 'CY004';
    END IF;
    v_open := EXISTS (SELECT 1 FROM cyclone.runs r
                       WHERE r.run_id = v_s.last_run_id AND r.status IN ('running', 'blocked'));
    FOR i IN 1 .. v_n LOOP
        fire_at := p_fire_times[i];
        submit_key := 'schedule:' || p_name || ':'
                      || to_char(fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
        IF v_open AND v_s.overlap = 'skip' THEN
            run_id := NULL;
            outcome := 'overlap';
        ELSE
            SELECT r.run_id, r.created INTO run_id, v_created
              FROM cyclone.run_submit(p_run_ids[i], v_s.workflow_name, submit_key, v_s.input,
                                      v_s.nodes, p_tags => v_s.tags) r;
            outcome := CASE WHEN v_created THEN 'submitted' ELSE 'existing' END;
            v_s.last_run_id := run_id;
            v_open := EXISTS (SELECT 1 FROM cyclone.runs r
                               WHERE r.run_id = v_s.last_run_id
                                 AND r.status IN ('running', 'blocked'));
        END IF;
        RETURN NEXT;
    END LOOP;
    UPDATE cyclone.schedules s
       SET next_fire_at = p_next_fire_at,
           last_fire_at = coalesce(p_fire_times[v_n], s.last_fire_at),
           last_run_id = v_s.last_run_id,
           updated_at = cyclone.now()
     WHERE s.name = p_name;
END;
$$;
