-- Internals: helpers the transitions call. None is called by the server directly.
--
-- Lock order, to stay free of deadlocks: a function that changes more than one row
-- locks the run row first (FOR NO KEY UPDATE, through _run_lock), then steps.
-- step_claim and the sweep meet step rows first: they take run locks only with SKIP
-- LOCKED, so they never wait while holding a step.
--
-- Errors carry SQLSTATEs of their own, which every SDK maps to one exception:
--   CY001 lease lost     (gRPC ABORTED)
--   CY002 not found      (gRPC NOT_FOUND)
--   CY003 wrong state    (gRPC FAILED_PRECONDITION)
--   CY004 unknown resolution (gRPC INVALID_ARGUMENT; step_resolve)
--   CY005 step_complete repeated a committed completion (the worker rolls back)
--   CY006 invalid workflow or submit argument (gRPC INVALID_ARGUMENT; cyclone.submit)

-- Locks a run row and returns its status; CY002 when there is no such run. The
-- transitions on one run call it first (_step_complete, _step_fail_unheld,
-- step_abandon, step_retry, step_resolve, run_cancel); step_complete_many locks its
-- runs itself, in run_id order.
-- A time as messages show it to a person: to the second, in UTC, with its zone
-- ("2026-05-01 14:03:07 UTC"), never an epoch or microseconds.
CREATE FUNCTION cyclone._when(p_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC'
$$;

CREATE FUNCTION cyclone._run_lock(p_run_id uuid) RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_status text;
BEGIN
    SELECT status INTO v_status FROM cyclone.runs WHERE run_id = p_run_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'CY002';
    END IF;
    RETURN v_status;
END;
$$;

-- Exponential backoff before the attempt after p_attempt, less p_jitter (from 0 to 1)
-- times half of it (step_fail, for a retryable failure with no retry_after, draws the
-- jitter with random() itself: on Citus an UPDATE may call no volatile function).
CREATE FUNCTION cyclone._backoff(
    p_initial interval, p_max interval, p_multiplier float8, p_attempt integer,
    p_jitter float8)
RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT d * (1 - p_jitter / 2)
      FROM (SELECT least(p_max, p_initial * power(p_multiplier, least(p_attempt - 1, 60)))) b(d)
$$;

-- p_at + p_by, for a p_by of seconds only (as Cyclone's intervals are: the backoffs,
-- timeouts and retry_after, made by make_interval(secs => ...)), so that the sum does
-- not depend on the session's time zone: IMMUTABLE, where the operator is STABLE. On
-- Citus an UPDATE of a distributed table may call no STABLE function on its columns.
-- Called by _step_fail_unheld.
CREATE FUNCTION cyclone._later(p_at timestamptz, p_by interval) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_at + p_by
$$;

-- Raises the error that explains why p_lease_token no longer holds (p_run_id, p_node),
-- given the step's current status, lease token and attempt (all NULL: no such step):
-- CY002, or CY001 with DETAIL current_attempt=N (the server's cyclone-current-attempt
-- trailer). Called by step_heartbeat and the Complete transitions when their guard
-- matched no row.
CREATE FUNCTION cyclone._lease_lost(
    p_run_id uuid, p_node text, p_lease_token uuid, p_status text, p_holder uuid,
    p_attempt integer)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_status IS NULL THEN
        RAISE EXCEPTION 'step (%, %) not found', p_run_id, p_node USING ERRCODE = 'CY002';
    END IF;
    IF p_holder = p_lease_token THEN
        RAISE EXCEPTION 'lease lost: the lease of (%, %) attempt % is no longer valid (step is %)',
            p_run_id, p_node, p_attempt, p_status
            USING ERRCODE = 'CY001', DETAIL = format('current_attempt=%s', p_attempt);
    END IF;
    RAISE EXCEPTION 'lease lost: this token does not hold (%, %), which is now at attempt % (%)',
        p_run_id, p_node, p_attempt, p_status
        USING ERRCODE = 'CY001', DETAIL = format('current_attempt=%s', p_attempt);
END;
$$;

-- Wakes the claims waiting for these actions (a Claim's long poll). A NOTIFY inside a
-- writing transaction takes a database-wide lock from just before its commit until the
-- commit record is flushed, so every notifying transaction would wait for the previous
-- one's fsync. Server connections therefore set cyclone.defer_notify = on: transitions
-- then only record the actions they made ready in cyclone.ready (transaction-local),
-- which the server reads in the same statement (service/db/*.sql), wakes its own
-- waiting claims and sends one coalesced NOTIFY for other servers from a connection
-- that writes nothing. Other callers (a worker's own completion transaction) notify
-- inline, delivered at commit.
CREATE FUNCTION cyclone._notify_ready(p_actions text[]) RETURNS void
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

-- Whether a step whose upstream is all final runs, by its trigger rule and how many
-- of its upstream steps ended discarded or skipped (_settle).
CREATE FUNCTION cyclone._rule_met(p_rule text, p_failed integer) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_rule
               WHEN 'all_success' THEN p_failed = 0
               WHEN 'all_done' THEN true
               ELSE p_failed > 0
           END
$$;

-- Propagates steps that just became final to their dependents, in waves: each wave's
-- finals are counted at their pending dependents (deps_open - 1, and deps_failed + 1
-- for a final that is not completed); a pending step whose upstream is all final is
-- judged by its trigger rule (_rule_met) and becomes ready, or skipped (a skip is
-- final in turn and joins the next wave). A root (no upstream) always runs, as at
-- submit. Ready steps become available when the run is running; while it is blocked
-- they stay pending (held until Resolve). Then the run is closed by the count of steps
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
CREATE FUNCTION cyclone._settle(p_run_id uuid, p_final text[], p_decide text[], p_closed integer,
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
    v_running := (SELECT r.status = 'running' FROM cyclone.runs r WHERE r.run_id = p_run_id);
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

-- A child run p_run_id of p_parent just finished (completed, failed or cancelled, its
-- status p_status, returned): the parent's node waiting for it is woken
-- (_wake_waiting, "child <run_id>"). The caller holds the child's run lock, not its
-- parent's (child_wait, 48_children.sql, says why none is taken). Called by
-- _runs_close and run_cancel.
CREATE FUNCTION cyclone._child_finished(p_run_id uuid, p_parent uuid, p_status text)
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cyclone._wake_waiting(p_parent, 'child ' || p_run_id);
    RETURN p_status;
END;
$$;

-- Closes runs by counts: each run's steps_open goes down by the number of its steps
-- that became final; a running run left with none open is completed, or failed with
-- a StepDiscarded error naming its first discarded step. A child run that finishes so
-- wakes its parent's node when it waits for it (_child_finished, called for those
-- runs only). Returns each run's status. Each run is found by primary key and updated
-- by its ctid (a join of the list with runs by = ANY was a scan of the list per run),
-- and a closing run's discarded step is looked up once, by key, through
-- steps_discarded_idx, so no plan scans steps or runs. PL/pgSQL so that the
-- statement's plan is kept for the session (before PostgreSQL 18 a SQL function's was
-- made again at every call: a fifth of this function's time in a drain on PostgreSQL
-- 15). Called by _run_close and by step_complete_many (runs whose completed steps have
-- no dependents).
CREATE FUNCTION cyclone._runs_close(p_runs uuid[], p_closed integer[],
                                    p_now timestamptz)
RETURNS TABLE (run_id uuid, status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        UPDATE cyclone.runs r
           SET steps_open = r.steps_open - c.closed,
               updated_at = p_now,
               status = CASE WHEN NOT c.closing THEN r.status
                             WHEN c.error IS NULL THEN 'completed' ELSE 'failed' END,
               finished_at = CASE WHEN c.closing THEN p_now ELSE r.finished_at END,
               error = coalesce(c.error, r.error)
          -- Each run read once by key (the callers hold its lock, so the version read
          -- is the one updated), then updated by its ctid: no join of the runs with the
          -- list, whatever the statistics. A run that closes here has its first
          -- discarded step looked up, once, by key (CASE evaluates the lookup only for
          -- a closing run); its StepDiscarded error makes it failed.
          FROM (SELECT c.closed, x.row_id, x.closing,
                       CASE WHEN x.closing THEN (
                           SELECT jsonb_build_object(
                                      'kind', 'StepDiscarded',
                                      'message', format('node %s was discarded at attempt %s',
                                                        s.node, s.attempt),
                                      'node', s.node, 'attempt', s.attempt,
                                      'started_at', s.started_at)
                             FROM cyclone.steps s
                            WHERE s.run_id = c.run_id AND s.status = 'discarded'
                            ORDER BY s.finished_at, s.node LIMIT 1) END AS error
                  FROM unnest(p_runs, p_closed) AS c(run_id, closed)
                 CROSS JOIN LATERAL (
                       SELECT x.ctid AS row_id,
                              x.steps_open <= c.closed AND x.status = 'running' AS closing
                         FROM cyclone.runs x WHERE x.run_id = c.run_id OFFSET 0) x
                -- OFFSET 0: one lookup per run, however often its error is named.
                OFFSET 0) c
         WHERE r.ctid = c.row_id
        -- CASE evaluates its branch only when taken: runs without a parent, and runs
        -- that did not finish here, cost nothing more.
        RETURNING r.run_id,
                  CASE WHEN r.parent_run_id IS NOT NULL AND r.finished_at = p_now
                       THEN cyclone._child_finished(r.run_id, r.parent_run_id, r.status)
                       ELSE r.status END;
END;
$$;

-- _runs_close for one run: called by _settle, and by _step_complete for a step with no
-- dependents (nothing to propagate).
CREATE FUNCTION cyclone._run_close(p_run_id uuid, p_closed integer,
                                              p_now timestamptz)
RETURNS text
LANGUAGE sql AS $$
    SELECT c.status FROM cyclone._runs_close(ARRAY[p_run_id], ARRAY[p_closed], p_now) c
$$;

-- Blocks a running run on its uncertain node: the run's available steps are held
-- (pending) until Resolve, and the run becomes blocked with p_error (EffectUncertain:
-- kind, message, node, attempt, started_at, and step_id for a step call). The caller
-- holds the run row lock and has made the node uncertain. Called by _block_uncertain,
-- step_abandon and step_call_begin.
CREATE FUNCTION cyclone._run_block(p_run_id uuid, p_error jsonb, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_workflow text;
BEGIN
    UPDATE cyclone.steps s SET status = 'pending', available_at = NULL
     WHERE s.run_id = p_run_id AND s.status = 'available';
    UPDATE cyclone.runs r SET status = 'blocked', updated_at = p_now, error = p_error
     WHERE r.run_id = p_run_id
    RETURNING r.workflow INTO v_workflow;
    RETURN v_workflow;
END;
$$;

-- One journal entry as JSON: every column of cyclone.step_calls but its node's key.
-- The shape handed out by step_claim, step_call_begin, _step_call_end and run_get.
CREATE FUNCTION cyclone._step_call_json(p_call cyclone.step_calls) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(p_call) - 'run_id' - 'node'
$$;
