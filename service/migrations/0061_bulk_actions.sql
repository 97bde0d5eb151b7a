-- Bulk actions: the jobs table and its functions (service/schema/75_bulk.sql).

-- state: running (set by bulk_start), done (bulk_apply, at the last batch),
-- cancelled (bulk_cancel). The query is the filter as runs_list takes it (a workflow
-- prefix already turned into names, the statuses narrowed to those the action applies
-- to); the filter is the request's, as JSON, for display. The cursor is the last run
-- acted on, (cursor_at, cursor_run); NULL before the first batch.
CREATE TABLE cyclone.bulk_actions (
    job_id           uuid        PRIMARY KEY,
    action           text        NOT NULL
                                 CHECK (action IN ('cancel', 'retry', 'resolve_discard')),
    filter           jsonb       NOT NULL,
    query            jsonb       NOT NULL,
    reason           text        NOT NULL DEFAULT '',
    actor            text        NOT NULL,
    state            text        NOT NULL DEFAULT 'running'
                                 CHECK (state IN ('running', 'done', 'cancelled')),
    total            bigint      NOT NULL,
    total_at_least   boolean     NOT NULL DEFAULT false,
    touched          bigint      NOT NULL DEFAULT 0,
    skipped          bigint      NOT NULL DEFAULT 0,
    failed           bigint      NOT NULL DEFAULT 0,
    last_error       text,
    cursor_at        timestamptz,
    cursor_run       uuid,
    lease_owner      text,
    lease_expires_at timestamptz,
    cancelled_by     text,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz
);

CREATE INDEX bulk_actions_created_idx ON cyclone.bulk_actions (created_at DESC, job_id DESC);

-- Records a new job, running, and wakes the servers' bulk loops (the name
-- cyclone.bulk is made ready: no action can have it). RPC: StartBulkAction.
CREATE FUNCTION cyclone.bulk_start(p_job_id uuid, p_action text, p_filter jsonb,
                                   p_query jsonb, p_reason text, p_actor text,
                                   p_total bigint, p_total_at_least boolean)
RETURNS SETOF cyclone.bulk_actions
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := cyclone.now();
    v_job cyclone.bulk_actions;
BEGIN
    INSERT INTO cyclone.bulk_actions (job_id, action, filter, query, reason, actor, total,
                                      total_at_least, created_at, updated_at)
    VALUES (p_job_id, p_action, p_filter, p_query, coalesce(p_reason, ''), p_actor, p_total,
            p_total_at_least, v_now, v_now)
    RETURNING * INTO v_job;
    PERFORM cyclone._notify_ready(ARRAY['cyclone.bulk']);
    RETURN NEXT v_job;
END;
$$;

-- Takes the lease of the oldest running job nobody holds (or whose holder's lease
-- lapsed: a server stopped or killed), for p_lease_s seconds; no row when there is
-- none. The UPDATE checks the lease again under the row's lock, so two servers never
-- hold one job.
CREATE FUNCTION cyclone.bulk_claim(p_owner text, p_lease_s double precision)
RETURNS SETOF cyclone.bulk_actions
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := cyclone.now();
    v_job_id uuid;
    v_job    cyclone.bulk_actions;
BEGIN
    FOR v_job_id IN
        SELECT j.job_id FROM cyclone.bulk_actions j
         WHERE j.state = 'running'
           AND (j.lease_expires_at IS NULL OR j.lease_expires_at <= v_now)
         ORDER BY j.created_at, j.job_id
         LIMIT 10
    LOOP
        UPDATE cyclone.bulk_actions j
           SET lease_owner = p_owner,
               lease_expires_at = v_now + make_interval(secs => p_lease_s)
         WHERE j.job_id = v_job_id AND j.state = 'running'
           AND (j.lease_expires_at IS NULL OR j.lease_expires_at <= v_now)
        RETURNING * INTO v_job;
        IF FOUND THEN
            RETURN NEXT v_job;
            RETURN;
        END IF;
    END LOOP;
END;
$$;

-- One batch of a job: p_runs, the runs after the cursor (p_after_at, p_after_run) that
-- the job's query matched, acted on one by one, and the cursor moved to the last of
-- them (p_cursor_at, p_cursor_run), in this transaction; p_done ends the job (the
-- batch was the last). Applied only while p_owner holds the lease and the cursor is
-- where the caller read it; otherwise nothing is done and the job is returned as it is
-- (the caller stops: another server has it, or it was cancelled). A run no longer in a
-- state the action applies to is skipped; one whose transition raises is counted as
-- failed (its error kept in last_error) and the others go on. Renews the lease.
CREATE FUNCTION cyclone.bulk_apply(p_job_id uuid, p_owner text, p_lease_s double precision,
                                   p_after_at timestamptz, p_after_run uuid, p_runs uuid[],
                                   p_cursor_at timestamptz, p_cursor_run uuid,
                                   p_done boolean)
RETURNS SETOF cyclone.bulk_actions
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := cyclone.now();
    v_job     cyclone.bulk_actions;
    v_tag     jsonb := jsonb_build_object('bulk_action', p_job_id);
    v_run     uuid;
    v_status  text;
    v_error   jsonb;
    v_last    bigint;
    v_touched bigint := 0;
    v_skipped bigint := 0;
    v_failed  bigint := 0;
    v_message text;
BEGIN
    UPDATE cyclone.bulk_actions j
       SET cursor_at = p_cursor_at, cursor_run = p_cursor_run, updated_at = v_now,
           lease_expires_at = v_now + make_interval(secs => p_lease_s)
     WHERE j.job_id = p_job_id AND j.state = 'running' AND j.lease_owner = p_owner
       AND j.cursor_at IS NOT DISTINCT FROM p_after_at
       AND j.cursor_run IS NOT DISTINCT FROM p_after_run
    RETURNING * INTO v_job;
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM cyclone.bulk_actions j WHERE j.job_id = p_job_id;
        RETURN;
    END IF;
    FOR i IN 1 .. coalesce(cardinality(p_runs), 0) LOOP
        v_run := p_runs[i];
        BEGIN
            v_status := cyclone._run_lock(v_run);
            v_last := coalesce((SELECT max(a.id) FROM cyclone.audit a WHERE a.run_id = v_run), 0);
            IF v_job.action = 'cancel' AND v_status IN ('running', 'failed', 'blocked') THEN
                PERFORM cyclone.run_cancel(v_run, v_job.actor, v_job.reason, false);
            ELSIF v_job.action = 'retry' AND v_status = 'failed' THEN
                PERFORM cyclone.step_retry(v_run, NULL, v_job.actor, v_job.reason);
            ELSIF v_job.action = 'resolve_discard' AND v_status = 'blocked' THEN
                v_error := (SELECT r.error FROM cyclone.runs r WHERE r.run_id = v_run);
                IF v_error ? 'step_id' THEN
                    PERFORM cyclone.step_call_resolve(v_run, NULL, v_error->>'step_id',
                                                      'discard', NULL, v_job.actor,
                                                      v_job.reason);
                ELSE
                    PERFORM cyclone.step_resolve(v_run, v_error->>'node', 'discard', NULL,
                                                 v_job.actor, v_job.reason);
                END IF;
            ELSE
                v_skipped := v_skipped + 1;
                CONTINUE;
            END IF;
            UPDATE cyclone.audit a SET details = coalesce(a.details, '{}'::jsonb) || v_tag
             WHERE a.run_id = v_run AND a.id > v_last;
            v_touched := v_touched + 1;
        EXCEPTION WHEN OTHERS THEN
            IF SQLSTATE = 'CY002' THEN
                v_skipped := v_skipped + 1;  -- deleted meanwhile (retention)
            ELSE
                v_failed := v_failed + 1;
                v_message := left(format('run %s: %s', v_run, SQLERRM), 2000);
            END IF;
        END;
    END LOOP;
    UPDATE cyclone.bulk_actions j
       SET touched = j.touched + v_touched, skipped = j.skipped + v_skipped,
           failed = j.failed + v_failed, last_error = coalesce(v_message, j.last_error),
           state = CASE WHEN p_done THEN 'done' ELSE j.state END,
           finished_at = CASE WHEN p_done THEN v_now END
     WHERE j.job_id = p_job_id
    RETURNING * INTO v_job;
    RETURN NEXT v_job;
END;
$$;

-- Stops a running job: no batch starts after this commits, and one in progress (it
-- holds the job's row) ends first; the runs acted on stay as they are. CY002 for an
-- unknown job, CY003 when it is no longer running. RPC: CancelBulkAction.
CREATE FUNCTION cyclone.bulk_cancel(p_job_id uuid, p_actor text)
RETURNS SETOF cyclone.bulk_actions
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := cyclone.now();
    v_job cyclone.bulk_actions;
BEGIN
    SELECT * INTO v_job FROM cyclone.bulk_actions j WHERE j.job_id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'bulk action % not found', p_job_id USING ERRCODE = 'CY002';
    END IF;
    IF v_job.state <> 'running' THEN
        RAISE EXCEPTION 'bulk action % is already %', p_job_id, v_job.state
            USING ERRCODE = 'CY003';
    END IF;
    UPDATE cyclone.bulk_actions j
       SET state = 'cancelled', cancelled_by = p_actor, finished_at = v_now,
           updated_at = v_now, lease_owner = NULL, lease_expires_at = NULL
     WHERE j.job_id = p_job_id
    RETURNING * INTO v_job;
    RETURN NEXT v_job;
END;
$$;
