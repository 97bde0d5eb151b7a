-- Pause and resume: of a run (run_pause, run_resume), and of a workflow or an action
-- across every run (pause_set, pause_clear, the table cyclone.pauses). A paused run's
-- steps that would be available are held pending until it is resumed: every
-- transition that makes a step available holds it instead (_settle, step_fail,
-- sweep_steps, steps_release, step_wait, step_resolve, step_call_resolve), and
-- _wake_waiting wakes a held wait too. The claim's pick passes over paused actions
-- and the runs of paused workflows (step_claim and the sharded candidate reads).
-- service/schema/75_pauses.sql says more.

ALTER TABLE cyclone.runs
    ADD COLUMN paused_at    timestamptz,
    ADD COLUMN paused_by    text,
    ADD COLUMN pause_reason text;

-- Workflows and actions an operator paused (pause_set, pause_clear; 75_pauses.sql): no
-- claim hands out a step of a paused action, nor of a run of a paused workflow (step_claim
-- and step_candidates_sharded read this table in their pick). A few rows at most; on
-- Citus a reference table, so that every node reads it where it claims.
CREATE TABLE cyclone.pauses (
    -- 'workflow' or 'action'.
    kind   text        NOT NULL,
    name   text        NOT NULL,
    actor  text        NOT NULL,
    reason text        NOT NULL DEFAULT '',
    at     timestamptz NOT NULL,
    PRIMARY KEY (kind, name),
    CONSTRAINT pauses_kind_known CHECK (kind IN ('workflow', 'action'))
);

-- Every pause and resume of a workflow or an action, oldest first (a run's are in its
-- audit trail): what, who, why, when. Written by pause_set and pause_clear when they
-- change something; ListPauses shows the latest.
CREATE TABLE cyclone.pause_log (
    kind   text        NOT NULL,
    name   text        NOT NULL,
    -- 'pause' or 'resume'.
    action text        NOT NULL,
    actor  text        NOT NULL,
    reason text        NOT NULL DEFAULT '',
    at     timestamptz NOT NULL,
    CONSTRAINT pause_log_known CHECK (kind IN ('workflow', 'action')
                                      AND action IN ('pause', 'resume'))
);
CREATE INDEX pause_log_name_idx ON cyclone.pause_log (kind, name, at);


-- Hands back steps that a Claim took but could not deliver (its caller went away):
-- available again as if never claimed, attempt and uncertainty as they were; held
-- pending instead in a paused run (75_pauses.sql). Each run is locked first (in run_id
-- order, as step_complete_many locks them), so that a pause of it is seen whole or
-- not at all; a run no longer running is left alone. Returns the actions of the steps
-- made available, one row each. Called by the server (steps_release, claim.sql).
CREATE FUNCTION cyclone.steps_release(p_run_ids uuid[], p_nodes text[], p_tokens uuid[],
                                      p_uncertain boolean[])
RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_step   record;
    v_paused boolean;
    v_action text;
BEGIN
    FOR v_step IN
        SELECT r.run_id, r.node, r.token, r.uncertain
          FROM unnest(p_run_ids, p_nodes, p_tokens, p_uncertain)
               AS r(run_id, node, token, uncertain)
         ORDER BY r.run_id
    LOOP
        SELECT u.paused_at IS NOT NULL INTO v_paused FROM cyclone.runs u
         WHERE u.run_id = v_step.run_id AND u.status = 'running' FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        UPDATE cyclone.steps s
           SET status = CASE WHEN v_paused THEN 'pending' ELSE 'available' END,
               attempt = s.attempt - 1, available_at = cyclone.now(),
               lease_expires_at = NULL, effect_uncertain = v_step.uncertain
         WHERE s.run_id = v_step.run_id AND s.node = v_step.node AND s.status = 'running'
           AND s.lease_token = v_step.token
        RETURNING s.action INTO v_action;
        IF FOUND AND NOT v_paused THEN
            RETURN NEXT v_action;
        END IF;
    END LOOP;
END;
$$;


-- Refuses what pause_set and pause_clear cannot name: CY004.
CREATE FUNCTION cyclone._pause_check(p_kind text, p_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('workflow', 'action') THEN
        RAISE EXCEPTION 'unknown kind of pause %: workflow or action', left(p_kind, 50)
            USING ERRCODE = 'CY004';
    END IF;
    IF p_name IS NULL OR char_length(p_name) NOT BETWEEN 1 AND 200
       OR p_name ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'a % name is 1 to 200 characters, none a control character', p_kind
            USING ERRCODE = 'CY004';
    END IF;
END;
$$;


-- Pauses a running or blocked run (see above) for p_actor, with p_reason (audited:
-- "pause", with how many steps it held). Returns whether it changed anything: false
-- when the run was paused already (nothing is written then). CY002 for an unknown run,
-- CY003 for a finished one. RPC: PauseRun.
CREATE FUNCTION cyclone.run_pause(p_run_id uuid, p_actor text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_held   integer;
BEGIN
    IF v_status NOT IN ('running', 'blocked') THEN
        RAISE EXCEPTION 'run % is %: only a running or blocked run can be paused',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    IF (SELECT r.paused_at IS NOT NULL FROM cyclone.runs r WHERE r.run_id = p_run_id) THEN
        RETURN false;
    END IF;
    UPDATE cyclone.runs r
       SET paused_at = v_now, paused_by = p_actor, pause_reason = coalesce(p_reason, '')
     WHERE r.run_id = p_run_id;
    UPDATE cyclone.steps s SET status = 'pending'
     WHERE s.run_id = p_run_id AND s.status = 'available';
    GET DIAGNOSTICS v_held = ROW_COUNT;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, '', 'pause', p_actor, coalesce(p_reason, ''),
            jsonb_build_object('held', v_held, 'status', v_status), v_now);
    RETURN true;
END;
$$;


-- Resumes a paused run: the pause is cleared and, when the run is running, the steps
-- held while it was paused become available at the time each was due (at once when
-- that has passed), their actions notified; a blocked run keeps them held until
-- Resolve. Audited ("resume", with how many steps it released). Returns whether it
-- changed anything: false when the run was not paused. CY002 for an unknown run.
-- RPC: ResumeRun.
CREATE FUNCTION cyclone.run_resume(p_run_id uuid, p_actor text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_status  text := cyclone._run_lock(p_run_id);
    v_actions text[] := '{}';
BEGIN
    IF (SELECT r.paused_at IS NULL FROM cyclone.runs r WHERE r.run_id = p_run_id) THEN
        RETURN false;
    END IF;
    UPDATE cyclone.runs r SET paused_at = NULL, paused_by = NULL, pause_reason = NULL
     WHERE r.run_id = p_run_id;
    IF v_status = 'running' THEN
        WITH released AS (
            UPDATE cyclone.steps s
               SET status = 'available', available_at = coalesce(s.available_at, v_now)
             WHERE s.run_id = p_run_id AND s.status = 'pending' AND s.deps_open = 0
            RETURNING s.action)
        SELECT coalesce(array_agg(DISTINCT action), '{}') INTO v_actions FROM released;
        PERFORM cyclone._notify_ready(v_actions);
    END IF;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, '', 'resume', p_actor, coalesce(p_reason, ''),
            jsonb_build_object('actions', to_jsonb(v_actions), 'status', v_status), v_now);
    RETURN true;
END;
$$;


-- Pauses a workflow or an action (p_kind 'workflow' or 'action') for p_actor, with
-- p_reason: from this commit on no claim hands out a step of it. Logged in
-- cyclone.pause_log. Returns whether it changed anything (false: paused already; the
-- first pause's actor and reason stand). CY004 for an unknown kind or a name no
-- workflow or action can have (1 to 200 characters, none a control character).
-- RPC: PauseName.
CREATE FUNCTION cyclone.pause_set(p_kind text, p_name text, p_actor text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    PERFORM cyclone._pause_check(p_kind, p_name);
    INSERT INTO cyclone.pauses AS p (kind, name, actor, reason, at)
    VALUES (p_kind, p_name, p_actor, coalesce(p_reason, ''), v_now)
        ON CONFLICT (kind, name) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO cyclone.pause_log (kind, name, action, actor, reason, at)
    VALUES (p_kind, p_name, 'pause', p_actor, coalesce(p_reason, ''), v_now);
    RETURN true;
END;
$$;


-- Resumes a paused workflow or action: its steps are claimable again, and the claims
-- of the actions concerned are woken (an action's own; every action for a workflow).
-- Logged in cyclone.pause_log. Returns whether it changed anything (false: it was not
-- paused). CY004 as pause_set. RPC: ResumeName.
CREATE FUNCTION cyclone.pause_clear(p_kind text, p_name text, p_actor text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    PERFORM cyclone._pause_check(p_kind, p_name);
    DELETE FROM cyclone.pauses p WHERE p.kind = p_kind AND p.name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO cyclone.pause_log (kind, name, action, actor, reason, at)
    VALUES (p_kind, p_name, 'resume', p_actor, coalesce(p_reason, ''), v_now);
    -- A workflow's runs may have steps of any action: the waiting claims of every
    -- action the servers know of look again (a claim woken for nothing waits again).
    PERFORM cyclone._notify_ready(CASE WHEN p_kind = 'action' THEN ARRAY[p_name]
                                       ELSE ARRAY(SELECT a.action FROM cyclone.action_claims a)
                                  END);
    RETURN true;
END;
$$;


-- Propagates steps that just became final to their dependents, in waves: each wave's
-- finals are counted at their pending dependents (deps_open - 1, and deps_failed + 1
-- for a final that is not completed); a pending step whose upstream is all final is
-- judged by its trigger rule (_rule_met) and becomes ready, or skipped (a skip is
-- final in turn and joins the next wave). A root (no upstream) always runs, as at
-- submit. Ready steps become available when the run is running and not paused; while
-- it is blocked they stay pending (held until Resolve), while it is paused too (held
-- until run_resume). Then the run is closed by the count of steps
-- made final (_run_close). Returns the run's status.
-- A dependent that the count leaves ready in a running run is made available by the
-- counting update itself: one new version of its row, not two.
-- Every statement reaches the run's steps by key (node = ANY of a list): none joins
-- steps to a set of nodes. For such a join a planner that expects a run to have a few
-- steps (no statistics, or statistics of small runs) put the run's steps outside and
-- the set inside: for a fan-out of 10,000 that was 50 million comparisons, 15 s to
-- complete its root (docs/performance.md, "Wide fan-outs").
--   p_final:  nodes that just became final
--   p_decide: pending nodes to judge now (step_retry, step_resolve)
--   p_closed: how many steps the caller made final itself
--   p_from:   for a p_final of one node whose release is in progress (cyclone.releases,
--             release_continue), the position in its dependents to count from
-- A release in chunks: a wave of one final with more than 1,000 dependents (c_chunk),
-- in a run with no release in progress, is counted at its first 1,000 dependents only,
-- and the rest are left in cyclone.releases for release_continue, 1,000 per
-- transaction, so that the first dependents can be claimed while the others are
-- counted. For a fan-out of 10,000 the whole count was one 80 ms transaction, and no
-- leaf could be claimed before its commit (docs/performance.md, "Wide fan-outs").
-- The caller holds the run row lock. Called by _step_complete, step_complete_many,
-- step_fail, sweep_steps, step_retry, step_resolve and release_continue.
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
    -- Steps are released in a running run that is not paused (75_pauses.sql).
    v_running := (SELECT r.status = 'running' AND r.paused_at IS NULL
                    FROM cyclone.runs r WHERE r.run_id = p_run_id);
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


-- _step_fail_unheld, and while the run is blocked a retry is held like the run's other
-- ready steps: pending, released by Resolve together with them (at once: the backoff
-- is not kept across the block), and the answer says pending with no retry_at. While
-- the run is paused a retry is held too, pending until run_resume, its retry_at kept.
-- For a durable function, the failure that ended its body is not kept in its journal:
-- the node's last entry (greatest seq), when it is a safe call's failure, is deleted,
-- so that the next attempt calls it again. A failure the body handled and went on from
-- (a later entry exists) stays, and unsafe entries are never deleted here.
-- RPC: Complete with a failure; also called by step_complete_many.
CREATE OR REPLACE FUNCTION cyclone.step_fail(
    p_run_id uuid, p_node text, p_lease_token uuid, p_type text, p_message text,
    p_details text, p_retryable boolean, p_retry_after interval)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- Generic plans, here and in the functions it calls (step_complete_many says why).
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    -- Takes the run lock, which holds until the caller's transaction ends.
    v_done cyclone.completion := cyclone._step_fail_unheld(
        p_run_id, p_node, p_lease_token, p_type, p_message, p_details, p_retryable,
        p_retry_after);
BEGIN
    IF v_done.step_status = 'available' AND v_done.run_status = 'blocked' THEN
        UPDATE cyclone.steps s SET status = 'pending', available_at = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'available';
        v_done.step_status := 'pending';
        v_done.retry_at := NULL;
    ELSIF v_done.step_status = 'available'
          AND (SELECT r.paused_at IS NOT NULL FROM cyclone.runs r WHERE r.run_id = p_run_id) THEN
        -- A paused run: held with the end of its backoff kept (run_resume).
        UPDATE cyclone.steps s SET status = 'pending'
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'available';
        v_done.step_status := 'pending';
    END IF;
    DELETE FROM cyclone.step_calls c
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.status = 'failed' AND NOT c.unsafe
       AND c.seq > ALL (SELECT o.seq FROM cyclone.step_calls o
                         WHERE o.run_id = p_run_id AND o.node = p_node
                           AND o.step_id <> c.step_id);
    RETURN v_done;
END;
$$;


-- Takes up to p_limit running steps whose lease expired, oldest expiry first, in runs
-- that are running (run rows taken with SKIP LOCKED, each step re-checked by its token
-- and expiry under its row lock, so any number of sweepers never fight). A lease that
-- lapsed before the step's deadline means its worker was lost (it died, froze or lost
-- its connection): the attempt counts as a recovery (recoveries + 1), not against the
-- node's retry policy, and the worker is marked unhealthy in cyclone.worker_health (it
-- is handed nothing until it shows it is alive). A lease that ran to the deadline is the
-- step's timeout: that attempt counts against the retry policy as a failure would.
-- Each step becomes available at once (held pending in a paused run, until run_resume),
-- remembered as effect_uncertain (the next claim
-- decides: an unsafe claimer blocks the run, any other runs it again), or discarded
-- when its holder did not mark the action unsafe and either its worker was lost more
-- than p_max_recoveries times (the server's --max-recoveries) or it is out of attempts
-- (attempt - resumes - recoveries >= max_attempts: claims that resumed a wait and
-- attempts whose worker was lost do not count); its dependents are then judged by
-- _settle. An error of kind lease_expired is recorded either way: type WorkerLost
-- naming the worker and the recovery budget, or LeaseExpired at the deadline. Steps of
-- blocked and cancelled runs are left alone. The workers marked unhealthy are written
-- last, in worker order, so two sweeps never wait on each other.
-- Returns each step reclaimed: run, node, action, the attempt whose lease expired, the
-- worker that held it, the status it was left in and whether its worker was lost (for
-- the server's logs and metrics). Called by each server's background sweep loop.
CREATE OR REPLACE FUNCTION cyclone.sweep_steps(p_limit integer, p_max_recoveries integer DEFAULT 10)
RETURNS TABLE (run_id uuid, node text, action text, attempt integer, worker_id text,
               status text, lost boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_cand    record;
    v_step    record;
    v_rec     integer;
    v_discard boolean;
    v_held    boolean;
    v_lost    text[] := '{}';
    v_reasons text[] := '{}';
BEGIN
    FOR v_cand IN
        SELECT s.run_id, s.node, s.lease_token FROM cyclone.steps s
         WHERE s.status = 'running' AND s.lease_expires_at <= v_now
         ORDER BY s.lease_expires_at LIMIT p_limit
    LOOP
        -- A paused run's step is held (pending) rather than made available.
        SELECT r.paused_at IS NOT NULL INTO v_held FROM cyclone.runs r
         WHERE r.run_id = v_cand.run_id AND r.status = 'running'
           FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        SELECT s.attempt, s.resumes, s.recoveries, s.max_attempts, s.unsafe, s.action,
               s.worker_id, s.lease_expires_at < s.deadline_at AS lost
          INTO v_step
          FROM cyclone.steps s
         WHERE s.run_id = v_cand.run_id AND s.node = v_cand.node AND s.status = 'running'
           AND s.lease_token = v_cand.lease_token AND s.lease_expires_at <= v_now
           FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        v_rec := v_step.recoveries + CASE WHEN v_step.lost THEN 1 ELSE 0 END;
        v_discard := NOT v_step.unsafe
                     AND (v_step.lost AND v_rec > p_max_recoveries
                          OR v_step.attempt - v_step.resumes - v_rec >= v_step.max_attempts);
        UPDATE cyclone.steps s
           SET status = CASE WHEN v_discard THEN 'discarded'
                             WHEN v_held THEN 'pending' ELSE 'available' END,
               available_at = CASE WHEN v_discard THEN NULL ELSE v_now END,
               finished_at = CASE WHEN v_discard THEN v_now END,
               effect_uncertain = true,
               lease_expires_at = NULL,
               recoveries = v_rec
         WHERE s.run_id = v_cand.run_id AND s.node = v_cand.node;
        INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
        VALUES (v_cand.run_id, v_cand.node, v_step.attempt, 'lease_expired',
                CASE WHEN v_step.lost THEN 'WorkerLost' ELSE 'LeaseExpired' END,
                CASE
                    WHEN NOT v_step.lost THEN
                        format('lease of worker %s ran to the step''s timeout with no outcome',
                               v_step.worker_id)
                    WHEN v_rec > p_max_recoveries THEN
                        format('worker %s lost: its lease lapsed with no outcome; the step '
                               'lost its worker %s times, past the recovery budget of %s '
                               '(the server''s --max-recoveries)',
                               v_step.worker_id, v_rec, p_max_recoveries)
                    ELSE
                        format('worker %s lost: its lease lapsed with no outcome (recovery '
                               '%s of %s; not counted as an attempt)',
                               v_step.worker_id, v_rec, p_max_recoveries)
                END,
                NOT v_discard, v_now);
        IF v_step.lost AND v_step.worker_id IS NOT NULL THEN
            v_lost := v_lost || v_step.worker_id;
            v_reasons := v_reasons || format('the lease of %s/%s attempt %s lapsed',
                                             v_cand.run_id, v_cand.node, v_step.attempt);
        END IF;
        IF v_discard THEN
            PERFORM cyclone._settle(v_cand.run_id, ARRAY[v_cand.node], '{}', 1);
        ELSIF NOT v_held THEN
            PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
        END IF;
        run_id := v_cand.run_id;
        node := v_cand.node;
        action := v_step.action;
        attempt := v_step.attempt;
        worker_id := v_step.worker_id;
        status := CASE WHEN v_discard THEN 'discarded'
                       WHEN v_held THEN 'pending' ELSE 'available' END;
        lost := v_step.lost;
        RETURN NEXT;
    END LOOP;
    INSERT INTO cyclone.worker_health AS h (worker_id, unhealthy_since, reason)
    SELECT DISTINCT ON (l.worker_id) l.worker_id, v_now, l.reason
      FROM unnest(v_lost, v_reasons) AS l(worker_id, reason)
     ORDER BY l.worker_id
        ON CONFLICT (worker_id) DO NOTHING;
END;
$$;


-- A durable function waits, in one transaction, fenced by the lease (CY001, and the
-- run locked first): p_function is cyclone.sleep (until p_wake_at), cyclone.event
-- (p_event, within p_timeout; NULL: no limit) or cyclone.child (p_child). The first
-- call records the wait WAITING with its wake time (the sleep's end, the event's
-- deadline, NULL for none) and what it waits for; a later call of the same step_id
-- (a replay) keeps both. Returns:
--   ready      the entry is now SUCCEEDED (the sleep is over; the oldest unconsumed
--              event of that name is consumed, its payload the output; the child
--              finished) or FAILED (EventTimeout: the deadline passed with no event),
--              or had its outcome already; the node keeps its lease;
--   suspended  the entry stays WAITING and the node gives up its lease: available from
--              the wake time (_wait_forever() for none; pending while the run is
--              blocked), lease cleared, resumes + 1 (so this claim does not use up an
--              attempt: step_fail and the sweep compare attempt - resumes -
--              recoveries with max_attempts), waiting_for set ("sleep", "event <name>",
--              "child <run_id>"). Waiting claims are notified, so that they look at
--              the new wake time.
-- CY004 for a bad identity or wait, or a step_id recorded for another call; CY003
-- past the journal's limit. RPC: Wait; also the server's loop for DAG event nodes.
CREATE OR REPLACE FUNCTION cyclone.step_wait(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_function text, p_wake_at timestamptz, p_event text, p_timeout interval,
    p_child uuid)
RETURNS TABLE (decision text, call jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_status  text;
    v_paused  boolean;
    v_attempt integer;
    v_for     text;
    v_call    cyclone.step_calls;
    v_outcome jsonb;
    v_payload jsonb;
    v_action  text;
BEGIN
    PERFORM cyclone._step_call_check(p_step_id, p_seq, p_function);
    IF p_function = 'cyclone.sleep' THEN
        IF p_wake_at IS NULL OR NOT isfinite(p_wake_at) THEN
            RAISE EXCEPTION 'a sleep needs a finite wake time' USING ERRCODE = 'CY004';
        END IF;
        v_for := 'sleep';
    ELSIF p_function = 'cyclone.event' THEN
        PERFORM cyclone._event_text_check(p_event, 'an event name');
        IF p_timeout IS NOT NULL
           AND (p_timeout < interval '1 millisecond' OR p_timeout > interval '366 days') THEN
            RAISE EXCEPTION 'an event timeout must be between 1ms and 366 days, got %',
                p_timeout USING ERRCODE = 'CY004';
        END IF;
        v_for := 'event ' || p_event;
    ELSIF p_function = 'cyclone.child' THEN
        IF p_child IS NULL THEN
            RAISE EXCEPTION 'a child wait needs the child''s run_id' USING ERRCODE = 'CY004';
        END IF;
        v_for := 'child ' || p_child;
    ELSE
        RAISE EXCEPTION 'a wait''s function is cyclone.sleep, cyclone.event or cyclone.child'
            USING ERRCODE = 'CY004';
    END IF;

    v_status := cyclone._run_lock(p_run_id);
    v_attempt := cyclone._step_held(p_run_id, p_node, p_lease_token, true);
    SELECT * INTO v_call FROM cyclone.step_calls c
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id;
    IF FOUND THEN
        IF v_call.function <> p_function OR v_call.waiting_for IS DISTINCT FROM v_for THEN
            RAISE EXCEPTION 'step call % of node % is recorded as % (%), not as this wait (%)',
                p_step_id, p_node, v_call.function, coalesce(v_call.waiting_for, 'no wait'),
                v_for USING ERRCODE = 'CY004';
        END IF;
        IF v_call.status <> 'waiting' THEN
            RETURN QUERY SELECT 'ready', cyclone._step_call_json(v_call);
            RETURN;
        END IF;
    ELSE
        PERFORM cyclone._step_call_room(p_run_id, p_node);
        INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                             unsafe, attempt, started_at, wake_at,
                                             waiting_for)
        VALUES (p_run_id, p_node, p_step_id, p_seq, p_function, 'waiting', false, v_attempt,
                -- Searched, not simple, CASE: Citus sends the simple form to the shard
                -- as a comparison of text with boolean.
                v_now, CASE WHEN p_function = 'cyclone.sleep' THEN p_wake_at
                            WHEN p_function = 'cyclone.event' THEN v_now + p_timeout END,
                v_for)
        RETURNING c.* INTO v_call;
    END IF;

    IF p_function = 'cyclone.sleep' THEN
        IF v_call.wake_at <= v_now THEN
            v_outcome := jsonb_build_object('output', 'null'::jsonb);
        END IF;
    ELSIF p_function = 'cyclone.event' THEN
        UPDATE cyclone.events e
           SET consumed_at = v_now, consumed_node = p_node, consumed_step_id = p_step_id
         WHERE e.run_id = p_run_id
           AND e.event_id = (SELECT o.event_id FROM cyclone.events o
                              WHERE o.run_id = p_run_id AND o.name = p_event
                                AND o.consumed_at IS NULL
                              ORDER BY o.event_id LIMIT 1)
        RETURNING e.payload INTO v_payload;
        IF FOUND THEN
            v_outcome := jsonb_build_object('output', v_payload);
        ELSIF v_call.wake_at <= v_now THEN
            v_outcome := jsonb_build_object('error', jsonb_build_object(
                'type', 'EventTimeout',
                'message', format('no event %s came within %s', p_event,
                                  v_call.wake_at - v_call.started_at),
                'details', ''));
        END IF;
    ELSE
        v_outcome := cyclone._wait_child(p_run_id, p_node, p_step_id, p_child);
    END IF;

    IF v_outcome IS NOT NULL THEN
        UPDATE cyclone.step_calls c
           SET status = CASE WHEN v_outcome ? 'error' THEN 'failed' ELSE 'succeeded' END,
               output = v_outcome->'output', error = v_outcome->'error', attempt = v_attempt,
               finished_at = v_now
         WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id
        RETURNING c.* INTO v_call;
        UPDATE cyclone.steps s SET waiting_for = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.waiting_for IS NOT NULL;
        RETURN QUERY SELECT 'ready', cyclone._step_call_json(v_call);
        RETURN;
    END IF;

    -- In a paused run the node is held pending with its wake time (run_resume).
    v_paused := (SELECT r.paused_at IS NOT NULL FROM cyclone.runs r WHERE r.run_id = p_run_id);
    UPDATE cyclone.steps s
       SET status = CASE WHEN v_status = 'running' AND NOT v_paused THEN 'available'
                         ELSE 'pending' END,
           available_at = CASE WHEN v_status = 'running'
                               THEN coalesce(v_call.wake_at, cyclone._wait_forever()) END,
           lease_token = NULL, lease_expires_at = NULL, resumes = s.resumes + 1,
           waiting_for = v_for
     WHERE s.run_id = p_run_id AND s.node = p_node
    RETURNING s.action INTO v_action;
    IF v_status = 'running' AND NOT v_paused THEN
        PERFORM cyclone._notify_ready(ARRAY[v_action]);
    END IF;
    RETURN QUERY SELECT 'suspended', cyclone._step_call_json(v_call);
END;
$$;


-- Wakes the nodes of a run that wait for p_waiting_for ("event <name>", "child
-- <run_id>"): available now instead of at their wake time, their actions notified,
-- so that a claim takes them at once; their body replays to the wait, which then
-- finds what it waits for. Called by event_send, which holds the run lock, and by
-- _child_finished for a finishing child run, which holds the child's lock only
-- (child_wait, 48_children.sql, says why that is enough).
CREATE OR REPLACE FUNCTION cyclone._wake_waiting(p_run_id uuid, p_waiting_for text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := cyclone.now();
    v_woken text[];
BEGIN
    -- A node held while its run is paused (pending, its wake time kept) is woken too:
    -- run_resume then makes it available at once.
    WITH woken AS (
        UPDATE cyclone.steps s SET available_at = v_now
         WHERE s.run_id = p_run_id AND s.status IN ('available', 'pending')
           AND s.waiting_for = p_waiting_for AND s.available_at > v_now
        RETURNING s.action, s.status)
    SELECT array_agg(action) FILTER (WHERE status = 'available') INTO v_woken FROM woken;
    PERFORM cyclone._notify_ready(coalesce(v_woken, '{}'));
END;
$$;


-- Resolves a blocked run's uncertain step: result (the effect happened: the value is
-- its output, completed), error (it happened and failed: discarded, a resolved error
-- recorded, so failure-handling nodes run) or discard (it did not happen: available
-- again, with a fresh attempt budget as Retry grants). The run becomes running and the
-- steps held while it was blocked are released (_settle); in a paused run they, and a
-- discarded node, stay held until run_resume. The lease token of the
-- attempt that lost its lease is forgotten: a late Complete with it is refused, never
-- told that its outcome was recorded. CY003 when the run is not blocked or the node is
-- not its uncertain step or the run is blocked on a step call (step_call_resolve),
-- CY002 for an unknown node, CY004 for an unknown choice. RPC: Resolve.
CREATE OR REPLACE FUNCTION cyclone.step_resolve(p_run_id uuid, p_node text, p_choice text,
                                                p_value jsonb, p_actor text, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
    v_held   text[];
    v_error  jsonb;
    v_paused boolean;
BEGIN
    IF v_status <> 'blocked' THEN
        RAISE EXCEPTION 'run % is %, not blocked: only a blocked run can be resolved',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    SELECT r.error INTO v_error FROM cyclone.runs r WHERE r.run_id = p_run_id;
    IF v_error ? 'step_id' THEN
        RAISE EXCEPTION 'run % is blocked on step call % of node %: resolve it with step_id %',
            p_run_id, v_error->>'step_id', v_error->>'node', v_error->>'step_id'
            USING ERRCODE = 'CY003';
    END IF;
    SELECT s.status, s.attempt, s.action INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % has no node %', p_run_id, left(p_node, 200)
            USING ERRCODE = 'CY002';
    END IF;
    IF v_step.status <> 'uncertain' THEN
        RAISE EXCEPTION 'node % is %, not uncertain: only the uncertain step of a blocked run '
                        'can be resolved (here: %)', p_node, v_step.status,
            (SELECT string_agg(s.node, ', ') FROM cyclone.steps s
              WHERE s.run_id = p_run_id AND s.status = 'uncertain')
            USING ERRCODE = 'CY003';
    END IF;

    UPDATE cyclone.runs r SET status = 'running', error = NULL, updated_at = v_now
     WHERE r.run_id = p_run_id
    RETURNING r.paused_at IS NOT NULL INTO v_paused;
    -- Release what was held while blocked (_settle holds it still in a paused run).
    v_held := ARRAY(SELECT s.node FROM cyclone.steps s
                     WHERE s.run_id = p_run_id AND s.status = 'pending' AND s.deps_open = 0);
    CASE p_choice
    WHEN 'result' THEN
        UPDATE cyclone.steps s
           SET status = 'completed', output = coalesce(p_value, 'null'::jsonb),
               finished_at = v_now, effect_uncertain = false, lease_token = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], v_held, 1);
    WHEN 'error' THEN
        UPDATE cyclone.steps s
           SET status = 'discarded', finished_at = v_now, effect_uncertain = false,
               lease_token = NULL
         WHERE s.run_id = p_run_id AND s.node = p_node;
        INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
        VALUES (p_run_id, p_node, v_step.attempt, 'resolved', 'EffectFailed',
                p_value #>> '{}', false, v_now);
        PERFORM cyclone._settle(p_run_id, ARRAY[p_node], v_held, 1);
    WHEN 'discard' THEN
        UPDATE cyclone.steps s
           SET status = CASE WHEN v_paused THEN 'pending' ELSE 'available' END,
               available_at = v_now, effect_uncertain = false, lease_token = NULL,
               max_attempts = s.attempt - s.resumes - s.recoveries + s.attempt_budget
         WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._notify_ready(CASE WHEN v_paused THEN '{}' ELSE ARRAY[v_step.action] END);
        PERFORM cyclone._settle(p_run_id, '{}', v_held, 0);
    ELSE
        RAISE EXCEPTION 'unknown resolution %', left(p_choice, 50) USING ERRCODE = 'CY004';
    END CASE;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, p_node, 'resolve_' || p_choice, p_actor, coalesce(p_reason, ''),
            jsonb_build_object('attempt', v_step.attempt, 'value', p_value), v_now);
END;
$$;


-- Resolves a run blocked on a step call of a durable function (its error names the
-- node and step_id; p_node NULL means that node): result records the call's success
-- with p_value, error its failure {type EffectFailed, message p_value} (the body's
-- except runs on replay), discard deletes its entry (the call runs on replay). In each
-- case the node becomes available with a fresh attempt budget (as Retry grants), the
-- run running, and the steps held while it was blocked are released (_settle). Returns
-- the node. CY003 when the run is not blocked on that step call (the message names
-- what it is blocked on), CY002 for an unknown node, CY004 for an unknown choice.
-- RPC: Resolve with step_id.
CREATE OR REPLACE FUNCTION cyclone.step_call_resolve(
    p_run_id uuid, p_node text, p_step_id text, p_choice text, p_value jsonb, p_actor text,
    p_reason text)
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_error  jsonb;
    v_node   text;
    v_step   record;
    v_held   text[];
    v_paused boolean;
BEGIN
    IF p_choice IS NULL OR p_choice NOT IN ('result', 'error', 'discard') THEN
        RAISE EXCEPTION 'unknown resolution %', left(p_choice, 50) USING ERRCODE = 'CY004';
    END IF;
    IF v_status <> 'blocked' THEN
        RAISE EXCEPTION 'run % is %, not blocked: only a blocked run can be resolved',
            p_run_id, v_status USING ERRCODE = 'CY003';
    END IF;
    SELECT r.error INTO v_error FROM cyclone.runs r WHERE r.run_id = p_run_id;
    v_node := coalesce(nullif(p_node, ''), v_error->>'node');
    SELECT s.status, s.attempt, s.action INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = v_node FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % has no node %', p_run_id, left(v_node, 200)
            USING ERRCODE = 'CY002';
    END IF;
    IF NOT v_error ? 'step_id' THEN
        RAISE EXCEPTION 'run % is blocked on node % itself, not on a step call: resolve it '
                        'without step_id', p_run_id, v_error->>'node'
            USING ERRCODE = 'CY003';
    END IF;
    IF v_error->>'node' IS DISTINCT FROM v_node
       OR v_error->>'step_id' IS DISTINCT FROM p_step_id THEN
        RAISE EXCEPTION 'run % is blocked on step call % of node %, not on % of %',
            p_run_id, v_error->>'step_id', v_error->>'node', left(p_step_id, 200),
            left(v_node, 200)
            USING ERRCODE = 'CY003';
    END IF;

    CASE p_choice
    WHEN 'result' THEN
        UPDATE cyclone.step_calls c
           SET status = 'succeeded', output = coalesce(p_value, 'null'::jsonb),
               finished_at = v_now
         WHERE c.run_id = p_run_id AND c.node = v_node AND c.step_id = p_step_id
           AND c.status = 'started';
    WHEN 'error' THEN
        UPDATE cyclone.step_calls c
           SET status = 'failed', finished_at = v_now,
               error = jsonb_build_object('type', 'EffectFailed', 'message',
                                          coalesce(p_value #>> '{}', ''), 'details', '')
         WHERE c.run_id = p_run_id AND c.node = v_node AND c.step_id = p_step_id
           AND c.status = 'started';
    ELSE
        DELETE FROM cyclone.step_calls c
         WHERE c.run_id = p_run_id AND c.node = v_node AND c.step_id = p_step_id
           AND c.status = 'started';
    END CASE;

    UPDATE cyclone.runs r SET status = 'running', error = NULL, updated_at = v_now
     WHERE r.run_id = p_run_id
    RETURNING r.paused_at IS NOT NULL INTO v_paused;
    -- Release what was held while blocked (_settle holds it still in a paused run).
    v_held := ARRAY(SELECT s.node FROM cyclone.steps s
                     WHERE s.run_id = p_run_id AND s.status = 'pending' AND s.deps_open = 0);
    UPDATE cyclone.steps s
       SET status = CASE WHEN v_paused THEN 'pending' ELSE 'available' END,
           available_at = v_now, effect_uncertain = false, lease_token = NULL,
           max_attempts = s.attempt - s.resumes - s.recoveries + s.attempt_budget
     WHERE s.run_id = p_run_id AND s.node = v_node;
    PERFORM cyclone._notify_ready(CASE WHEN v_paused THEN '{}' ELSE ARRAY[v_step.action] END);
    PERFORM cyclone._settle(p_run_id, '{}', v_held, 0);
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, v_node, 'resolve_' || p_choice, p_actor, coalesce(p_reason, ''),
            jsonb_build_object('attempt', v_step.attempt, 'step_id', p_step_id,
                               'value', p_value),
            v_now);
    RETURN v_node;
END;
$$;


-- Claims up to p_limit ready steps of the actions a worker serves, highest priority
-- first, then oldest available_at, each action once however often p_actions names it,
-- with FOR UPDATE SKIP LOCKED: two claims never get the same step. Each becomes
-- running: attempt + 1, a new random lease token, deadline = now + timeout, lease =
-- min(p_lease, timeout), unsafe = whether the worker marks its action unsafe.
-- A ready step whose last lease expired with no outcome (effect_uncertain) is not
-- handed to a worker that marks its action unsafe: _block_uncertain blocks its run,
-- and it is returned first with blocked = true (and no lease). A worker that does not
-- mark it unsafe claims it like any step, with effect_uncertain = true in the reply.
-- Flow control (docs/flow-control.md): an action the worker declares rate limited
-- (p_rate_actions, with p_rate_counts claims per p_rate_periods) gets at most the room
-- _rate_room leaves in its window (its cyclone.action_rates row stays locked until
-- commit, and the claims made are added to it before the claim's update); a step with a
-- concurrency key is taken only while fewer than its limit run with that key: the walk
-- passes over keys already full (listed once, from steps_key_running_idx, as the
-- pick sees them), and _keys_room, under the keys' locks, gives the room of each key
-- picked; its steps are admitted in claim order. Steps and actions without them pay
-- for none of this. A claim may so return fewer steps than it could have.
-- Each row carries the run's input, the completed upstream outputs, how long the step
-- waited (waited_s) and, for a step allowed to run after a failure, its failed or
-- skipped upstream nodes with their last errors (upstream_failures), and the node's
-- journal of step calls in seq order (NULL when it has none).
-- Pauses (75_pauses.sql): a paused run's steps are pending, so the walk never meets
-- them; the walk skips a paused action (cyclone.pauses), and the steps of a run of a
-- paused workflow, read in the pick's own snapshot.
-- A worker marked unhealthy (cyclone.worker_health: a lease of it lapsed) gets nothing:
-- the pick reads the mark in its own snapshot, so a sweep that made steps available and
-- marked their worker (one commit) is seen whole or not at all; a claim for that worker
-- racing the sweep cannot take the steps the sweep freed.
-- Builds (32_builds.sql): a worker of build p_build takes a node pinned to another build
-- only when the node has no journal, or the build is in p_build's compatibility set;
-- a worker without a build (p_build NULL) takes pinned nodes only when they have no
-- journal (_build_admits). The claim pins the node to p_build, unless it has a journal
-- and a pin already (a compatible build's worker keeps it on the build that started it).
-- A retired build's workers get nothing. With no builds declared, the rule costs the
-- walk one NULL test per row and the claim no statement.
-- Two statements for plain steps: the pick (the walk, its locks, and what the rows
-- need beyond the plain case), then one update of the rows picked, by their ctids,
-- that reads each run by key and returns the rows; so no plan scans steps. A key, a
-- sleep that ends or a rate limit adds a statement of its own, only when there is one
-- (docs/performance.md, "The engine's SQL"). A generic plan is forced
-- (the plan is the same walk of the ready index for every argument, and replanning
-- cost ~0.45 ms of a 1.5 ms claim), and no hash or merge join: each join is a lookup
-- by key or ctid, whatever the statistics.
-- The claim commits durably, as every transition does (synchronous_commit is left as
-- the server has it): a claim's attempt is handed to its worker only once it survives a
-- crash of Postgres, so that no attempt number of a step is handed out twice, and the
-- logs and errors kept under an attempt are one execution's
-- (tests/test_claim_durability.py). RPC: Claim.
CREATE OR REPLACE FUNCTION cyclone.step_claim(
    p_worker text, p_actions text[], p_unsafe text[], p_limit integer, p_lease interval,
    p_rate_actions text[] DEFAULT '{}', p_rate_counts integer[] DEFAULT '{}',
    p_rate_periods interval[] DEFAULT '{}', p_build text DEFAULT NULL)
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb, run_deadline timestamptz, traceparent text)
LANGUAGE plpgsql
-- The plan is the same walk of the ready index for every argument, each join a lookup
-- by key or ctid (see above).
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    -- The rate-limited actions, and the room left in the window of each.
    v_rated text[] := '{}';
    v_rooms integer[] := '{}';
    -- The rows picked (then those admitted), by ctid; whether any has a concurrency key
    -- or ends a sleep; the steps (run_id || node) whose last lease expired unreported.
    v_rows      tid[];
    v_keyed     boolean;
    v_slept     boolean;
    v_uncertain text[];
    -- Whether every row picked is a first claim of a node with no upstream: then none
    -- has upstream outputs, upstream failures or a journal to hand out.
    v_plain     boolean;
    -- The builds whose pinned nodes this worker may take (_build_set).
    v_builds    text[] := '{}';
BEGIN
    -- A worker whose lease lapsed is handed nothing until it shows it is alive (checked
    -- here to block no run for it, and again by the pick, in the pick's snapshot).
    IF EXISTS (SELECT 1 FROM cyclone.worker_health h WHERE h.worker_id = p_worker) THEN
        RETURN;
    END IF;
    IF p_build IS NOT NULL THEN
        v_builds := cyclone._build_set(p_build);
        IF v_builds IS NULL THEN
            RETURN;  -- a retired build's workers take nothing
        END IF;
    END IF;

    IF cardinality(p_unsafe) > 0 THEN
        RETURN QUERY SELECT b.run_id, b.node, b.action, b.workflow, b.attempt, b.max_attempts,
                            NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::uuid,
                            NULL::timestamptz, NULL::timestamptz, NULL::jsonb, true, true,
                            NULL::float8, NULL::jsonb, NULL::jsonb, NULL::timestamptz,
                            NULL::text
                       FROM cyclone._block_uncertain(p_unsafe) b;
    END IF;

    IF cardinality(p_rate_actions) > 0 THEN
        -- Locked in action order, so that two claims never wait on each other.
        SELECT array_agg(o.action), array_agg(o.room) INTO v_rated, v_rooms
          FROM (SELECT r.action, cyclone._rate_room(r.action, r.count, r.period, v_now) AS room
                  FROM (SELECT * FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods)
                                   AS r(action, count, period)
                         ORDER BY r.action OFFSET 0) r) o;
    END IF;

    -- The pick: the ready rows, locked, in claim order (the walk of steps_ready_idx).
    -- What the claim needs beyond the plain case is found here: a concurrency key, a
    -- sleep that ends, an uncertain effect; each has a statement of its own below, run
    -- only when a picked row needs it, so a claim of plain steps runs two statements.
    SELECT coalesce(array_agg(c.row_id), '{}'), coalesce(bool_or(c.keyed), false),
           coalesce(bool_or(c.slept), false),
           coalesce(array_agg(c.uncertain) FILTER (WHERE c.uncertain IS NOT NULL), '{}'),
           coalesce(bool_and(c.plain), true)
      INTO v_rows, v_keyed, v_slept, v_uncertain, v_plain
      FROM (SELECT x.action,
                   least(p_limit, coalesce(v_rooms[array_position(v_rated, x.action)],
                                           p_limit)) AS room
              -- A paused action (cyclone.pauses) is not walked at all.
              FROM (SELECT DISTINCT x FROM unnest(p_actions) x
                     WHERE NOT EXISTS (SELECT 1 FROM cyclone.pauses p
                                        WHERE p.kind = 'action' AND p.name = x)) AS x(action)) AS a
     CROSS JOIN LATERAL (
           SELECT s.ctid AS row_id, s.concurrency_key IS NOT NULL AS keyed,
                  s.waiting_for IS NOT DISTINCT FROM 'sleep' AS slept,
                  -- A run_id's text has a fixed length: run_id || node names a step.
                  CASE WHEN s.effect_uncertain THEN s.run_id::text || s.node END
                      AS uncertain,
                  s.attempt = 0 AND cardinality(s.depends_on) = 0 AS plain
             FROM cyclone.steps s
            WHERE s.status = 'available' AND s.action = a.action
              AND s.available_at <= v_now
              AND NOT (s.effect_uncertain AND s.action = ANY (p_unsafe))
              AND cyclone._build_admits(s.build_id, v_builds, EXISTS (
                      SELECT 1 FROM cyclone.step_calls j
                       WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0))
              -- Pass over the keys already full as this statement sees them: listed
              -- once per claim, when the walk first meets a keyed step.
              AND (s.concurrency_key IS NULL
                   OR s.concurrency_key <> ALL (ARRAY(
                          SELECT k.concurrency_key FROM cyclone.steps k
                           WHERE k.status = 'running' AND k.concurrency_key IS NOT NULL
                           GROUP BY k.concurrency_key
                          HAVING count(*) >= min(k.concurrency_limit))))
              -- Pass over the runs of a paused workflow: the run is looked up only
              -- while some workflow is paused (the first test, and the list, are read
              -- once per claim). A scalar lookup of the run by key, OFFSET 0 keeping it
              -- one: written as NOT EXISTS, PostgreSQL 18 made it a hashed subplan
              -- that read every run.
              AND (NOT EXISTS (SELECT 1 FROM cyclone.pauses p WHERE p.kind = 'workflow')
                   OR (SELECT w.workflow FROM cyclone.runs w WHERE w.run_id = s.run_id OFFSET 0)
                      <> ALL (ARRAY(SELECT p.name FROM cyclone.pauses p
                                     WHERE p.kind = 'workflow')))
            ORDER BY s.priority DESC, s.available_at
            LIMIT a.room
              FOR UPDATE SKIP LOCKED) c
     -- Evaluated once, in this statement's snapshot.
     WHERE NOT EXISTS (SELECT 1 FROM cyclone.worker_health h WHERE h.worker_id = p_worker);
    IF cardinality(v_rows) = 0 THEN
        RETURN;
    END IF;
    IF cardinality(v_rows) > p_limit THEN
        -- Several actions gave more rows than the claim takes: the first p_limit of
        -- them in claim order. The rows past it stay locked until commit, unclaimed
        -- (the flags above may then speak of a row left out: each statement below
        -- reads the rows kept). One action never gives more than p_limit.
        v_rows := ARRAY(SELECT s.ctid FROM cyclone.steps s WHERE s.ctid = ANY (v_rows)
                         ORDER BY s.priority DESC, s.available_at LIMIT p_limit);
    END IF;

    IF v_keyed THEN
        -- Of the keyed rows picked, those each key has room for (_keys_room counts it
        -- under the keys' locks), in claim order; the others stay locked, unclaimed.
        -- The picked rows are read again by their ctids: this claim holds their locks.
        v_rows := ARRAY(
            WITH picked AS (
                SELECT s.ctid AS row_id, s.priority, s.available_at, s.concurrency_key,
                       s.concurrency_limit
                  FROM cyclone.steps s WHERE s.ctid = ANY (v_rows)
            ), keyed AS MATERIALIZED (
                SELECT r.concurrency_key, r.room
                  FROM (SELECT array_agg(k.concurrency_key) AS keys, array_agg(k.lim) AS limits
                          FROM (SELECT p.concurrency_key, min(p.concurrency_limit) AS lim
                                  FROM picked p WHERE p.concurrency_key IS NOT NULL
                                 GROUP BY p.concurrency_key) k) g
                 CROSS JOIN LATERAL cyclone._keys_room(g.keys, g.limits) r
            )
            SELECT p.row_id FROM picked p WHERE p.concurrency_key IS NULL
            UNION ALL
            SELECT p.row_id
              FROM (SELECT p.*, row_number() OVER (PARTITION BY p.concurrency_key
                                                   ORDER BY p.priority DESC, p.available_at) AS n
                      FROM picked p WHERE p.concurrency_key IS NOT NULL) p
              JOIN keyed k ON k.concurrency_key = p.concurrency_key
             WHERE p.n <= k.room);
    END IF;

    IF v_slept THEN
        -- A sleep is over once its node is claimed at or after the wake time: its
        -- journal entry succeeds here, as step_wait would record it when the body's
        -- replay reached the sleep, so the replay needs no Wait to go past it. Before
        -- the claim's update, which then hands out the journal as it is now.
        UPDATE cyclone.step_calls j
           SET status = 'succeeded', output = 'null', finished_at = v_now,
               attempt = s.attempt + 1
          FROM cyclone.steps s
         WHERE s.ctid = ANY (v_rows) AND s.waiting_for = 'sleep'
           AND j.run_id = s.run_id AND j.node = s.node
           AND j.status = 'waiting' AND j.function = 'cyclone.sleep'
           AND j.wake_at <= v_now;
    END IF;

    IF cardinality(p_rate_actions) > 0 THEN
        -- The claims of each rate-limited action join its window (locked by _rate_room).
        UPDATE cyclone.action_rates t
           SET (firsts, lasts, counts, reopens_at) = (
                   SELECT n.firsts, n.lasts, n.counts, n.reopens_at
                     FROM cyclone._rate_next(t.firsts, t.lasts, t.counts, r.count, r.period,
                                             v_now, r.n) n),
               updated_at = v_now
          FROM (SELECT r.action, r.count, r.period, c.n
                  FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods)
                       AS r(action, count, period)
                  JOIN (SELECT s.action, count(*)::integer AS n FROM cyclone.steps s
                         WHERE s.ctid = ANY (v_rows) GROUP BY s.action) c
                    ON c.action = r.action) r
         WHERE t.action = r.action;
    END IF;

    IF v_plain THEN
        -- The same update, with none of the lookups of upstream steps and journal.
        RETURN QUERY
            UPDATE cyclone.steps s
               SET status = 'running',
                   attempt = s.attempt + 1,
                   lease_token = gen_random_uuid(),
                   started_at = v_now,
                   last_heartbeat_at = v_now,
                   deadline_at = v_now + s.timeout,
                   lease_expires_at = v_now + least(p_lease, s.timeout),
                   worker_id = p_worker,
                   unsafe = s.action = ANY (p_unsafe),
                   effect_uncertain = false,
                   -- A node claimed at its wake time has slept: see v_slept above.
                   waiting_for = CASE WHEN s.waiting_for = 'sleep' THEN NULL
                                      ELSE s.waiting_for END,
                   -- A first claim: no journal, no pin yet.
                   build_id = p_build
              FROM cyclone.runs r
             WHERE s.ctid = ANY (v_rows) AND r.run_id = s.run_id
            RETURNING s.run_id, s.node, s.action, r.workflow, s.attempt, s.max_attempts, s.input,
                      r.input, NULL::jsonb, s.lease_token, s.lease_expires_at, s.deadline_at,
                      s.progress,
                      cardinality(v_uncertain) > 0 AND s.run_id::text || s.node = ANY (v_uncertain),
                      false, date_part('epoch', v_now - s.available_at), NULL::jsonb,
                      NULL::jsonb, r.deadline, r.traceparent;
        RETURN;
    END IF;

    -- The upstream outputs are read after the update, joined to its rows: a claim's
    -- steps that share their upstream (the leaves of one fan-out) share one lookup
    -- (the plan memoizes it by run_id and depends_on), where a subquery per row probed
    -- the same key once per step (docs/performance.md, "Wide fan-outs"). Each
    -- upstream node is one probe of the primary key by (run_id, node), OFFSET 0
    -- keeping it so: written as node = ANY (depends_on), PostgreSQL 15 and 16, with
    -- statistics of runs of one or two steps, put only run_id in the index condition
    -- and filtered the run's steps by the list, a read of every step of a fan-out's
    -- run for each leaf claimed.
    RETURN QUERY
        WITH claimed AS (
            UPDATE cyclone.steps s
               SET status = 'running',
                   attempt = s.attempt + 1,
                   lease_token = gen_random_uuid(),
                   started_at = v_now,
                   last_heartbeat_at = v_now,
                   deadline_at = v_now + s.timeout,
                   lease_expires_at = v_now + least(p_lease, s.timeout),
                   worker_id = p_worker,
                   unsafe = s.action = ANY (p_unsafe),
                   effect_uncertain = false,
                   -- A node claimed at its wake time has slept: see v_slept above.
                   waiting_for = CASE WHEN s.waiting_for = 'sleep' THEN NULL
                                      ELSE s.waiting_for END,
                   -- The pin stays while the node has a journal; else this build's.
                   build_id = CASE WHEN s.build_id IS NOT NULL AND EXISTS (
                                        SELECT 1 FROM cyclone.step_calls j
                                         WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0)
                                   THEN s.build_id ELSE p_build END
             -- The rows picked locked, by their ctids alone: no status condition here,
             -- which would let the planner read them through steps_ready_idx instead,
             -- a walk of every ready row (statistics taken while few rows were ready,
             -- as before a fan-out is released, make it look cheaper than the TID
             -- scan).
              FROM cyclone.runs r
             WHERE s.ctid = ANY (v_rows) AND r.run_id = s.run_id
            RETURNING s.run_id, s.node, s.action, r.workflow, s.attempt, s.max_attempts,
               s.input, r.input AS run_input, r.deadline AS run_deadline, r.traceparent,
               s.depends_on, s.lease_token, s.lease_expires_at,
               s.deadline_at, s.progress,
               -- A run_id's text has a fixed length: run_id || node names one step.
               cardinality(v_uncertain) > 0 AND s.run_id::text || s.node = ANY (v_uncertain)
                   AS uncertain,
               -- date_part: a float8 at once (extract's numeric costs a conversion per
               -- row).
               date_part('epoch', v_now - s.available_at) AS waited_s,
               CASE WHEN s.deps_failed > 0 THEN (
                   SELECT jsonb_agg(jsonb_build_object(
                              'node', u.node, 'status', u.status,
                              'error', CASE WHEN u.status = 'discarded' THEN (
                                  SELECT jsonb_build_object(
                                             'attempt', e.attempt, 'kind', e.kind,
                                             'type', e.type, 'message', e.message,
                                             'details', e.details,
                                             'retryable', e.retryable, 'at', e.at)
                                    FROM cyclone.step_errors e
                                   WHERE e.run_id = u.run_id AND e.node = u.node
                                   ORDER BY e.at DESC, e.attempt DESC LIMIT 1) END)
                          ORDER BY u.position)
                     FROM cyclone.steps u
                    WHERE u.run_id = s.run_id AND u.node = ANY (s.depends_on)
                      AND u.status IN ('discarded', 'skipped')) END AS failures,
               -- One probe of the journal's key per claimed step that was claimed
               -- before (a sleep that ended at this claim was recorded above, before
               -- this statement). A first claim (attempt 1) has no journal: every entry
               -- is written under a lease (_step_held), so none before a first claim.
               CASE WHEN s.attempt > 1 THEN (
                   SELECT jsonb_agg(cyclone._step_call_json(j) ORDER BY j.seq)
                     FROM cyclone.step_calls j
                    WHERE j.run_id = s.run_id AND j.node = s.node) END AS journal
        )
        SELECT c.run_id, c.node, c.action, c.workflow, c.attempt, c.max_attempts, c.input,
               c.run_input, up.outputs, c.lease_token, c.lease_expires_at, c.deadline_at,
               c.progress, c.uncertain, false, c.waited_s, c.failures, c.journal,
               c.run_deadline, c.traceparent
          FROM claimed c
          -- A node with no upstream gets no row here: outputs NULL, as before.
          LEFT JOIN LATERAL (
                SELECT jsonb_object_agg(u.node, u.output) AS outputs
                  FROM unnest(c.depends_on) AS d(node)
                 CROSS JOIN LATERAL (
                       SELECT u.node, u.output FROM cyclone.steps u
                        WHERE u.run_id = c.run_id AND u.node = d.node
                          AND u.status = 'completed' OFFSET 0) u) up ON true;
END;
$$;


-- A claim on a sharded database, its first read, as servers before migration 0029 made
-- it (kept for them during an upgrade; step_candidates_sharded replaces it): up to
-- p_limit ready steps of these actions on every shard, highest priority first, then
-- oldest, as step_claim walks them; no locks. (The time is read here, not in the
-- statement: on Citus a shard's statement may not read the clock, a reference table.)
CREATE OR REPLACE FUNCTION cyclone.step_candidates(p_actions text[], p_limit integer)
RETURNS TABLE (run_id uuid, node text)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    -- Paused actions and workflows (75_pauses.sql), passed over.
    v_off   text[] := ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'action');
    v_flows text[] := ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'workflow');
BEGIN
    RETURN QUERY
    SELECT s.run_id, s.node
      FROM cyclone.steps s
     WHERE s.status = 'available' AND s.action = ANY (p_actions) AND s.available_at <= v_now
       AND s.action <> ALL (v_off)
       AND (cardinality(v_flows) = 0
            OR NOT EXISTS (SELECT 1 FROM cyclone.runs w
                            WHERE w.run_id = s.run_id AND w.workflow = ANY (v_flows)))
     ORDER BY s.priority DESC, s.available_at
     LIMIT p_limit;
END;
$$;


-- A claim on a sharded database, its first read (Store._claim_sharded): up to p_limit
-- ready steps of these actions across every shard, highest priority first, then oldest
-- (step_claim's order), no locks, each with its run's shard and whether flow control
-- applies to it (flow: it has a concurrency key, or its action is one the worker
-- declares rate limited, p_rate_actions with p_rate_counts per p_rate_periods). As in
-- step_claim's walk, keys already full and rated actions whose window is full (as last
-- written) are passed over, so that they do not fill the batch; step_claim_flow counts
-- both again under their locks. Keys are looked at only when the read met a keyed step.
-- Steps the worker's build may not take (p_builds its set, as in step_claim_run) are
-- passed over too.
-- RPC: Claim, on Citus.
CREATE OR REPLACE FUNCTION cyclone.step_candidates_sharded(
    p_actions text[], p_limit integer, p_rate_actions text[], p_rate_counts integer[],
    p_rate_periods interval[], p_builds text[] DEFAULT '{}')
RETURNS TABLE (run_id uuid, node text, action text, shard bigint, concurrency_key text,
               concurrency_limit integer, flow boolean)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    -- Rate-limited actions whose window is full, and paused actions (75_pauses.sql).
    v_shut   text[] := ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'action');
    -- Paused workflows: their runs' steps are passed over.
    v_flows  text[] := ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'workflow');
    v_full   text[] := '{}';
    v_runs   uuid[];
    v_nodes  text[];
    v_acts   text[];
    v_keys   text[];
    v_limits integer[];
BEGIN
    IF cardinality(p_rate_actions) > 0 THEN
        v_shut := v_shut || ARRAY(
            SELECT r.action
              FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods) AS r(action, count, period)
              JOIN cyclone.action_rates t ON t.action = r.action
             WHERE (SELECT coalesce(sum(b.n), 0) FROM unnest(t.lasts, t.counts) AS b(last, n)
                     WHERE b.last > v_now - r.period) >= r.count);
    END IF;
    FOR pass IN 1 .. 2 LOOP
        SELECT array_agg(c.run_id ORDER BY c.i), array_agg(c.node ORDER BY c.i),
               array_agg(c.action ORDER BY c.i), array_agg(c.concurrency_key ORDER BY c.i),
               array_agg(c.concurrency_limit ORDER BY c.i)
          INTO v_runs, v_nodes, v_acts, v_keys, v_limits
          FROM (SELECT s.run_id, s.node, s.action, s.concurrency_key, s.concurrency_limit,
                       row_number() OVER (ORDER BY s.priority DESC, s.available_at) AS i
                  FROM (SELECT s.run_id, s.node, s.action, s.concurrency_key,
                               s.concurrency_limit, s.priority, s.available_at
                          FROM cyclone.steps s
                         WHERE s.status = 'available' AND s.action = ANY (p_actions)
                           AND s.available_at <= v_now AND s.action <> ALL (v_shut)
                           AND (s.concurrency_key IS NULL OR s.concurrency_key <> ALL (v_full))
                           AND cyclone._build_admits(s.build_id, p_builds, EXISTS (
                                   SELECT 1 FROM cyclone.step_calls j
                                    WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0))
                           AND (cardinality(v_flows) = 0
                                OR NOT EXISTS (SELECT 1 FROM cyclone.runs w
                                                WHERE w.run_id = s.run_id
                                                  AND w.workflow = ANY (v_flows)))
                         ORDER BY s.priority DESC, s.available_at
                         LIMIT p_limit) s) c;
        EXIT WHEN pass = 2 OR v_runs IS NULL
                  OR NOT EXISTS (SELECT 1 FROM unnest(v_keys) k WHERE k IS NOT NULL);
        -- The keys with as many running steps as their limit (a multi-shard read).
        v_full := ARRAY(SELECT k.concurrency_key FROM cyclone.steps k
                         WHERE k.status = 'running' AND k.concurrency_key IS NOT NULL
                         GROUP BY k.concurrency_key
                        HAVING count(*) >= min(k.concurrency_limit));
        EXIT WHEN NOT EXISTS (SELECT 1 FROM unnest(v_keys) k WHERE k = ANY (v_full));
    END LOOP;
    IF v_runs IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT u.run_id, u.node, u.action, u.shard, u.concurrency_key, u.concurrency_limit,
           u.concurrency_key IS NOT NULL OR u.action = ANY (p_rate_actions)
      FROM unnest(v_runs, v_nodes, v_acts, cyclone._shards_of(v_runs), v_keys, v_limits)
           WITH ORDINALITY AS u(run_id, node, action, shard, concurrency_key,
                                concurrency_limit, i)
     ORDER BY u.i;
END;
$$;


-- step_candidates_sharded for the one shard of p_run_id, when a multi-shard read cannot
-- be made (a worker node is down): up to p_limit ready steps of these actions on that
-- shard, in claim order, no locks, with their priority and due time so that the server
-- merges the shards' answers in claim order. Distributed by p_run_id (any run id of the
-- shard): delegated whole to the shard's node, which reads its tables directly. Keys
-- already full are not passed over here (step_claim_flow counts them under their
-- locks); rated actions whose window is full are. Called by the server for each shard
-- while the read across shards fails, so that the runs on the nodes that are up go on.
-- The rates' periods are seconds: Citus delegates a call only when its arguments are
-- plain values.
CREATE OR REPLACE FUNCTION cyclone.step_candidates_on(
    p_run_id uuid, p_actions text[], p_limit integer, p_rate_actions text[],
    p_rate_counts integer[], p_rate_periods float8[], p_builds text[] DEFAULT '{}')
RETURNS TABLE (run_id uuid, node text, action text, shard bigint, concurrency_key text,
               concurrency_limit integer, flow boolean, priority integer,
               available_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    -- Rate-limited actions whose window is full, and paused actions (75_pauses.sql).
    v_shut   text[] := ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'action');
    -- Paused workflows: their runs' steps are passed over.
    v_flows  text[] := ARRAY(SELECT p.name FROM cyclone.pauses p WHERE p.kind = 'workflow');
    v_shard  bigint := 0;
    v_tables text[] := ARRAY['cyclone.steps', 'cyclone.step_calls', 'cyclone.runs'];
BEGIN
    IF cardinality(p_rate_actions) > 0 THEN
        v_shut := v_shut || ARRAY(
            SELECT r.action
              FROM unnest(p_rate_actions, p_rate_counts, p_rate_periods) AS r(action, count, period)
              JOIN cyclone.action_rates t ON t.action = r.action
             WHERE (SELECT coalesce(sum(b.n), 0) FROM unnest(t.lasts, t.counts) AS b(last, n)
                     WHERE b.last > v_now - make_interval(secs => r.period)) >= r.count);
    END IF;
    IF cyclone.sharded() THEN
        v_shard := get_shard_id_for_distribution_column('cyclone.runs', p_run_id);
        v_tables := ARRAY(SELECT format('cyclone.%I', t.name || '_'
                                        || get_shard_id_for_distribution_column(
                                               ('cyclone.' || t.name)::regclass, p_run_id))
                            FROM unnest(ARRAY['steps', 'step_calls', 'runs'])
                                 WITH ORDINALITY AS t(name, i)
                           ORDER BY t.i);
        IF EXISTS (SELECT 1 FROM unnest(v_tables) n WHERE to_regclass(n) IS NULL) THEN
            RETURN;  -- not on the shard's node: nothing is read
        END IF;
    END IF;
    RETURN QUERY EXECUTE format($q$
        SELECT s.run_id, s.node, s.action, $7, s.concurrency_key, s.concurrency_limit,
               s.concurrency_key IS NOT NULL OR s.action = ANY ($5), s.priority,
               s.available_at
          FROM %1$s s
         WHERE s.status = 'available' AND s.action = ANY ($1)
           AND s.available_at <= $2 AND s.action <> ALL ($3)
           AND cyclone._build_admits(s.build_id, $6, EXISTS (
                   SELECT 1 FROM %2$s j
                    WHERE j.run_id = s.run_id AND j.node = s.node OFFSET 0))
           AND (cardinality($8) = 0
                OR NOT EXISTS (SELECT 1 FROM %3$s w
                                WHERE w.run_id = s.run_id AND w.workflow = ANY ($8)))
         ORDER BY s.priority DESC, s.available_at
         LIMIT $4
    $q$, v_tables[1], v_tables[2], v_tables[3])
      USING p_actions, v_now, v_shut, p_limit, p_rate_actions, p_builds, v_shard, v_flows;
END;
$$;
