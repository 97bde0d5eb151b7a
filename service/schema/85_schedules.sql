-- Schedules kept by the server (ScheduleService; docs/schedules.md).
--
-- The server computes fire times (cron expressions need a cron library, which SQL has
-- not); the engine keeps the schedule and submits its firings. Every server runs a
-- firing loop: one transaction locks the due schedules (FOR UPDATE SKIP LOCKED, so
-- servers share them out), calls schedule_fire for each, and commits. A firing is a
-- run_submit keyed 'schedule:<name>:<fire time>', so a firing submitted twice (a
-- server that died after its commit, before it knew) makes one run; a server killed
-- before its commit loses nothing: its transaction rolls back, the schedule is still
-- due, and another server fires it.

-- One schedule. Not a run's table: keyed by its name.
CREATE TABLE cyclone.schedules (
    name          text        PRIMARY KEY,
    -- The Workflow message as JSON (what GetSchedule shows), and what each firing
    -- submits: its name, and its nodes validated at creation as run_submit takes them,
    -- each concurrency key evaluated for the input (Submit's validation, done once).
    workflow      jsonb       NOT NULL,
    workflow_name text        NOT NULL,
    nodes         jsonb       NOT NULL,
    input         jsonb,
    -- Exactly one of a cron expression (with its IANA time zone) and an interval.
    cron          text,
    time_zone     text,
    interval_s    bigint,
    -- Overlap: 'skip' submits nothing while the last run is running or blocked.
    overlap       text        NOT NULL,
    -- Missed firings (more than a grace late): 'skip' them, or submit 'all' (bounded).
    catch_up      text        NOT NULL,
    paused        boolean     NOT NULL DEFAULT false,
    -- A fire time of the schedule; due when past.
    next_fire_at  timestamptz NOT NULL,
    -- The latest firing handled (submitted, or skipped for overlap), and the latest
    -- run submitted. No foreign key: retention may delete the run.
    last_fire_at  timestamptz,
    last_run_id   uuid,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    -- Whether nodes hold each concurrency key evaluated for input (CreateSchedule
    -- evaluates them). False only for a schedule stored by a server that kept the
    -- key templates as written: the firing pass evaluates its keys from workflow and
    -- input, stores them and sets this, before its next firing submits anything.
    nodes_keyed   boolean     NOT NULL DEFAULT true,
    -- The tags of each run a firing submits (a JSON object, checked as Submit checks
    -- a run's); NULL for none.
    tags          jsonb,
    CONSTRAINT schedules_name_valid CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$'),
    CONSTRAINT schedules_workflow_named CHECK (workflow ->> 'name' = workflow_name),
    CONSTRAINT schedules_nodes_array
        CHECK (jsonb_typeof(nodes) = 'array' AND jsonb_array_length(nodes) > 0),
    CONSTRAINT schedules_cron_xor_interval CHECK ((cron IS NULL) <> (interval_s IS NULL)),
    CONSTRAINT schedules_zone_iff_cron CHECK ((time_zone IS NULL) = (cron IS NULL)),
    CONSTRAINT schedules_cron_length CHECK (length(cron) BETWEEN 1 AND 200),
    CONSTRAINT schedules_interval_range CHECK (interval_s BETWEEN 1 AND 366 * 86400),
    CONSTRAINT schedules_overlap_known CHECK (overlap IN ('skip', 'allow')),
    CONSTRAINT schedules_catch_up_known CHECK (catch_up IN ('skip', 'all')),
    CONSTRAINT schedules_fires_forward CHECK (last_fire_at < next_fire_at)
);

-- The firing loop's question: which schedules are due.
CREATE INDEX schedules_due_idx ON cyclone.schedules (next_fire_at) WHERE NOT paused;

-- Fires one schedule, which the caller has locked (FOR UPDATE, in the same
-- transaction): submits a run for each of p_fire_times (ascending, none before the
-- schedule's next_fire_at) with the run id of the same rank in p_run_ids, then moves
-- next_fire_at to p_next_fire_at (after the last of them). With overlap 'skip', a
-- firing while the last run is running or blocked submits nothing. Fire times the
-- caller skipped as missed are simply not passed. One row per fire time: its key,
-- the run (NULL when skipped) and the outcome: 'submitted', 'existing' (the key had
-- its run already) or 'overlap'. Nothing when the schedule is gone or paused.
-- Raises CY004 for fire times that would not move the schedule forward.
CREATE FUNCTION cyclone.schedule_fire(p_name text, p_fire_times timestamptz[],
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
