-- The worker's database role, and a clock for completions made in a worker's transaction.
--
-- A worker that completes steps inside its own transaction (ctx.completion_tx() in
-- Python, or one SQL call from any language: docs/exactly-once.md) logs in as a role
-- that is a member of cyclone_worker. That role may call cyclone.step_complete and
-- nothing else in the Cyclone schema: it can neither read nor write the tables.
-- step_complete is SECURITY DEFINER with a pinned search_path, so the only change a
-- worker can make to Cyclone's state is the one that function makes after checking
-- the lease token, and the token is the capability: a worker can only complete the
-- step it was handed.
--
-- The server connects as the owner of the schema, which keeps every right on its own
-- objects whatever is revoked from PUBLIC here.

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

-- Functions are executable by PUBLIC unless that is revoked; no Cyclone function is
-- for PUBLIC, including those later migrations add.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA cyclone FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA cyclone REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

GRANT USAGE ON SCHEMA cyclone TO cyclone_worker;
GRANT EXECUTE ON FUNCTION cyclone.step_complete(uuid, text, uuid, jsonb) TO cyclone_worker;

-- Cyclone's clock reads the time of the statement rather than of the transaction. The
-- server runs each transition as one statement in autocommit, where the two are the
-- same. A worker's completion transaction begins with its first business write, which
-- can be long before the handler returns: on the transaction's clock, step_complete
-- would take a lease that ran out meanwhile for a live one until the sweep reclaimed
-- the step. On the statement's clock the lease is checked when the call is made.
CREATE OR REPLACE FUNCTION cyclone.now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT statement_timestamp() + offset_by FROM cyclone.clock
$$;
