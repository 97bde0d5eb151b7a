-- Deferred wake-ups. A NOTIFY inside a writing transaction takes a database-wide lock
-- from just before its commit until the commit record is flushed, so every notifying
-- transaction waits for the previous one's fsync: measured here, 2,600 commits/s fell
-- to 730. Server connections set cyclone.defer_notify = on: transitions then only
-- record the actions they made ready in cyclone.ready (transaction-local), the server
-- reads it in the same statement, wakes its own waiting claims at once and sends one
-- coalesced NOTIFY for other servers from a connection that writes nothing. Other
-- callers (a worker's own completion transaction) still notify inline.
CREATE OR REPLACE FUNCTION cyclone._notify_ready(p_actions text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(p_actions) = 0 THEN
        RETURN;
    END IF;
    IF current_setting('cyclone.defer_notify', true) = 'on' THEN
        -- Action names cannot contain a comma (pyclient.dag.NAME_PATTERN).
        PERFORM set_config('cyclone.ready',
                           concat_ws(',', nullif(current_setting('cyclone.ready', true), ''),
                                     array_to_string(p_actions, ',')),
                           true);
    ELSE
        PERFORM pg_notify('cyclone_ready', a) FROM (SELECT DISTINCT unnest(p_actions) AS a) t;
    END IF;
END;
$$;
