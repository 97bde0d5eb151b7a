-- The worker's database role, and the completion call's clock.
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

-- The lease is checked at the time of the call. In a worker's own transaction, now()
-- is when that transaction began (its first business write), which can be long
-- before the handler returns: checked against it, a lease that ran out while the
-- handler was still working would pass until the sweep reclaimed the step. Same body
-- as in 0002 otherwise.
CREATE OR REPLACE FUNCTION cyclone.step_complete(
    p_run_id uuid, p_node text, p_lease_token uuid, p_output jsonb)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    -- Cyclone's clock (cyclone.now(), which tests move) at the start of this call.
    v_now    timestamptz := cyclone.now() + (statement_timestamp() - now());
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
BEGIN
    UPDATE cyclone.steps s
       SET status = 'completed', output = coalesce(p_output, 'null'::jsonb),
           finished_at = v_now, lease_expires_at = NULL
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'running'
       AND s.lease_token = p_lease_token AND s.lease_expires_at > v_now;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        IF v_step.status = 'completed' AND v_step.lease_token = p_lease_token THEN
            RETURN ROW('completed', v_status, true, NULL)::cyclone.completion;
        END IF;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                v_step.lease_token, v_step.attempt);
    END IF;
    PERFORM cyclone._settle(p_run_id, ARRAY[p_node], '{}', 1);
    RETURN ROW('completed', (SELECT r.status FROM cyclone.runs r WHERE r.run_id = p_run_id),
               false, NULL)::cyclone.completion;
END;
$$;
