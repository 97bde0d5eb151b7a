-- The worker's database role, and who may call what.
--
-- A worker that completes steps inside its own transaction (ctx.completion_tx() in
-- Python, or one SQL call from any language: docs/exactly-once.md) logs in as a role
-- that is a member of cyclone_worker. That role may call cyclone.step_complete and
-- cyclone.step_call_record (a step call's success, docs/exactly-once.md) and nothing
-- else in the Cyclone schema: it can neither read nor write the tables. Both are
-- SECURITY DEFINER with a pinned search_path, so the only changes a worker can make to
-- Cyclone's state are the ones they make after checking the lease token. The server connects as the owner of the schema, which keeps every
-- right on its own objects.

-- Roles belong to the whole Postgres cluster, not to one database: another Cyclone
-- database on the same cluster may have created it already (or be creating it now).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cyclone_worker') THEN
        CREATE ROLE cyclone_worker NOLOGIN;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN
        NULL;
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'cannot create role cyclone_worker: %', SQLERRM
            USING HINT = 'Create it once as a superuser (CREATE ROLE cyclone_worker NOLOGIN), '
                         'or run the migrations as a role with CREATEROLE.';
END;
$$;

-- The client's role: an application that creates runs in its own transactions
-- (docs/submit-from-sql.md) logs in as a member of cyclone_client, which may call
-- cyclone.submit and nothing else.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cyclone_client') THEN
        CREATE ROLE cyclone_client NOLOGIN;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN
        NULL;
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'cannot create role cyclone_client: %', SQLERRM
            USING HINT = 'Create it once as a superuser (CREATE ROLE cyclone_client NOLOGIN), '
                         'or run the migrations as a role with CREATEROLE.';
END;
$$;

-- Functions are executable by PUBLIC unless that is revoked: no Cyclone function is for
-- PUBLIC. (service/migrate.py revokes it again after every migrate, for functions a
-- later migration adds.)
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA cyclone FROM PUBLIC;

GRANT USAGE ON SCHEMA cyclone TO cyclone_worker;
GRANT EXECUTE ON FUNCTION cyclone.step_complete(uuid, text, uuid, jsonb) TO cyclone_worker;
GRANT EXECUTE ON FUNCTION cyclone.step_call_record(uuid, text, uuid, text, integer, text, jsonb,
                                                   text)
    TO cyclone_worker;

GRANT USAGE ON SCHEMA cyclone TO cyclone_client;
GRANT EXECUTE ON FUNCTION cyclone.submit(jsonb, jsonb, text, timestamptz, integer, jsonb,
                                         timestamptz)
    TO cyclone_client;
