-- cyclone.submit takes a deadline, checked as Submit checks one.

-- A time as Python's datetime.isoformat writes a UTC one, as the server's messages do.
CREATE FUNCTION cyclone._iso(p_at timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
       || CASE WHEN extract(microseconds FROM p_at)::bigint % 1000000 = 0 THEN ''
               ELSE to_char(p_at AT TIME ZONE 'UTC', '.US') END
       || '+00:00';
$$;

-- What is wrong with a run's deadline (p_deadline, NULL: none given), as Submit says it
-- (service/api/submit.py deadline_time): not in the future, more than 366 days ahead,
-- or not after the run's start time. NULL when nothing is.
CREATE FUNCTION cyclone._deadline_error(p_deadline timestamptz, p_start_at timestamptz)
RETURNS text
LANGUAGE sql AS $$
SELECT CASE
    WHEN p_deadline IS NULL THEN NULL
    WHEN p_deadline <= clock_timestamp()
        THEN format('deadline %s is not in the future (now %s)', cyclone._iso(p_deadline),
                    cyclone._iso(clock_timestamp()))
    WHEN p_deadline > clock_timestamp() + interval '366 days'
        THEN format('deadline is %s days ahead; the limit is 366 days',
                    round(extract(epoch FROM p_deadline - clock_timestamp()) / 86400))
    WHEN p_start_at IS NOT NULL AND p_deadline <= p_start_at
        THEN format('deadline %s is not after start_at %s', cyclone._iso(p_deadline),
                    cyclone._iso(p_start_at))
END;
$$;

DROP FUNCTION cyclone.submit(jsonb, jsonb, text, timestamptz, integer, jsonb);

-- Submit from SQL: creates a run of p_workflow in the caller's transaction, so that it
-- commits, or rolls back, with the caller's own writes (docs/submit-from-sql.md). The
-- workflow is JSON in the shape of a workflow file (`cyclone submit`); it is checked as
-- Submit checks it, by the server's default limits, and refused with SQLSTATE CY006 and
-- the server's message before anything is written. With a key, as SubmitOnce: at most
-- one run per (workflow name, key); a repeat returns that run with created = false.
-- Without a deadline the workflow's default applies (workflow_deadlines), as in Submit.
-- Waiting claims are notified at commit (run_submit; a rollback drops the notification).
-- SECURITY DEFINER with a pinned search_path: the one function the cyclone_client role
-- may call (90_roles.sql).
CREATE FUNCTION cyclone.submit(
    workflow jsonb, input jsonb DEFAULT NULL, key text DEFAULT NULL,
    start_at timestamptz DEFAULT NULL, priority integer DEFAULT 0, tags jsonb DEFAULT NULL,
    deadline timestamptz DEFAULT NULL, OUT run_id uuid, OUT created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_name  text := submit.workflow->>'name';
    v_nodes jsonb;
    v_run   uuid;
BEGIN
    PERFORM cyclone._refuse(cyclone._submit_args_error(submit.key, submit.start_at,
                                                       submit.priority, submit.tags));
    PERFORM cyclone._refuse(cyclone._deadline_error(submit.deadline, submit.start_at));
    v_nodes := cyclone._submit_nodes(submit.workflow, submit.input);
    v_run := CASE WHEN submit.key IS NULL THEN cyclone._uuid7()
                  ELSE cyclone.submit_key_id(v_name, submit.key) END;
    SELECT s.run_id, s.created INTO submit.run_id, submit.created
      FROM cyclone.run_submit(v_run, v_name, submit.key, submit.input, v_nodes,
                              submit.start_at, coalesce(submit.priority, 0),
                              nullif(nullif(submit.tags, 'null'), '{}'), submit.deadline) s;
END;
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA cyclone FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cyclone.submit(jsonb, jsonb, text, timestamptz, integer, jsonb,
                                         timestamptz)
    TO cyclone_client;
