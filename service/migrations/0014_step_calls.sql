-- Durable functions: the journal of step calls.
--
-- A node whose handler is a durable function records each step call its body makes in
-- cyclone.step_calls, keyed (run_id, node, step_id). New:
--   step_call_begin    BeginStepCall: RUN / RECORDED / UNCERTAIN; an unsafe call is
--                      recorded started first; an unsafe call started by an earlier
--                      attempt blocks the run (EffectUncertain with step_id)
--   _step_call_end     EndStepCall: the outcome (duplicate when it has one already)
--   step_call_record   the same in a worker's own transaction (CY005 on a repeat);
--                      executable by cyclone_worker
--   step_call_resolve  Resolve with step_id: result / error / discard of the call
--   _run_block         blocking a run, shared by _block_uncertain, step_abandon and
--                      step_call_begin (which now call it)
--   _step_call_json, _step_call_check, _step_held, _step_call_room: helpers
-- Changed:
--   step_claim         returns the node's journal (new column journal, in seq order)
--   step_fail          deletes the trailing safe failure of the node's journal
--   step_resolve       refuses a run blocked on a step call (it names the step_id)

-- The journal of a node whose handler is a durable function: one row per step call,
-- unique by (run_id, node, step_id). Deleted with its step (and so with its run).
--
-- Step call statuses, and the functions that set each one:
--   started    step_call_begin (an unsafe call, before its function runs)
--   succeeded  _step_call_end (EndStepCall, step_call_record); step_call_resolve result
--   failed     _step_call_end; step_call_resolve error (type EffectFailed)
-- Deleted by step_fail (the trailing safe failure that ended an attempt) and by
-- step_call_resolve discard.
CREATE TABLE cyclone.step_calls (
    run_id      uuid        NOT NULL,
    node        text        NOT NULL,
    -- Stable across replays: "charge_order", "charge_order#2", or a name given.
    step_id     text        NOT NULL,
    -- Position of the call in the body, 1 for the first.
    seq         integer     NOT NULL,
    function    text        NOT NULL,
    status      text        NOT NULL,
    -- The call was marked unsafe_to_repeat when it was recorded.
    unsafe      boolean     NOT NULL,
    output      jsonb,
    -- {type, message, details}
    error       jsonb,
    -- The node attempt that last wrote the entry.
    attempt     integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    PRIMARY KEY (run_id, node, step_id),
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE,
    CONSTRAINT step_calls_status_known CHECK (status IN ('started', 'succeeded', 'failed')),
    CONSTRAINT step_calls_output_iff_succeeded CHECK ((output IS NOT NULL) = (status = 'succeeded')),
    CONSTRAINT step_calls_error_iff_failed CHECK ((error IS NOT NULL) = (status = 'failed')),
    CONSTRAINT step_calls_finished_at_iff_outcome
        CHECK ((finished_at IS NOT NULL) = (status <> 'started')),
    CONSTRAINT step_calls_seq_in_range CHECK (seq BETWEEN 1 AND 100000)
);

-- Blocks a running run on its uncertain node: the run's available steps are held
-- (pending) until Resolve, and the run becomes blocked with p_error (EffectUncertain:
-- kind, message, node, attempt, started_at, and step_id for a step call). The caller
-- holds the run row lock and has made the node uncertain. Called by _block_uncertain,
-- step_abandon and step_call_begin.
CREATE FUNCTION cyclone._run_block(p_run_id uuid, p_error jsonb, p_now timestamptz)
RETURNS text
LANGUAGE sql AS $$
    UPDATE cyclone.steps s SET status = 'pending', available_at = NULL
     WHERE s.run_id = p_run_id AND s.status = 'available';
    UPDATE cyclone.runs r SET status = 'blocked', updated_at = p_now, error = p_error
     WHERE r.run_id = p_run_id
    RETURNING r.workflow;
$$;
-- One journal entry as JSON: every column of cyclone.step_calls but its node's key.
-- The shape handed out by step_claim, step_call_begin, _step_call_end and run_get.
CREATE FUNCTION cyclone._step_call_json(p_call cyclone.step_calls) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(p_call) - 'run_id' - 'node'
$$;
-- Blocks the runs whose ready, uncertain step is of an action in p_unsafe: the step
-- becomes uncertain, the run blocked with an EffectUncertain error, and the run's
-- other ready steps are held (pending) until Resolve. Rows are taken with SKIP
-- LOCKED; a step whose run is locked (or not running) is left for a later claim.
-- Called by step_claim when the worker marks actions unsafe.
CREATE OR REPLACE FUNCTION cyclone._block_uncertain(p_unsafe text[])
RETURNS TABLE (run_id uuid, node text, action text, workflow text, attempt integer,
               max_attempts integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := cyclone.now();
    v_step record;
BEGIN
    FOR v_step IN
        SELECT s.run_id, s.node, s.action, s.attempt, s.max_attempts, s.started_at
          FROM cyclone.steps s
         WHERE s.status = 'available' AND s.effect_uncertain AND s.action = ANY (p_unsafe)
           FOR UPDATE SKIP LOCKED
    LOOP
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM cyclone.runs r
             WHERE r.run_id = v_step.run_id AND r.status = 'running'
               FOR NO KEY UPDATE SKIP LOCKED);
        UPDATE cyclone.steps s SET status = 'uncertain'
         WHERE s.run_id = v_step.run_id AND s.node = v_step.node;
        workflow := cyclone._run_block(v_step.run_id, jsonb_build_object(
            'kind', 'EffectUncertain',
            'message', format(
                'node %s (action %s) lost its lease at attempt %s, started %s, with no '
                'outcome; its effect may have happened. Check, then Resolve with '
                'result, error or discard', v_step.node, v_step.action,
                v_step.attempt, v_step.started_at),
            'node', v_step.node, 'attempt', v_step.attempt,
            'started_at', v_step.started_at), v_now);
        run_id := v_step.run_id;
        node := v_step.node;
        action := v_step.action;
        attempt := v_step.attempt;
        max_attempts := v_step.max_attempts;
        RETURN NEXT;
    END LOOP;
END;
$$;
-- The handler of an action its worker marks unsafe_to_repeat stopped without an
-- outcome (time limit, cancellation, shutdown): its effect may have happened. Like a
-- lost lease met by an unsafe claim, the step becomes uncertain and the run blocked
-- (EffectUncertain) at once, and the run's available steps are held (pending); in a run
-- already blocked on another step it is held (pending, effect_uncertain) and blocks
-- the run again when next claimed by a worker that marks it unsafe. The error joins
-- the step's history (kind handler, not retryable). CY001 when the lease is lost.
-- RPC: Complete with a failure that has effect_uncertain; also step_complete_many.
CREATE OR REPLACE FUNCTION cyclone.step_abandon(p_run_id uuid, p_node text, p_lease_token uuid,
                                     p_type text, p_message text, p_details text)
RETURNS cyclone.completion
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := cyclone.now();
    v_status text := cyclone._run_lock(p_run_id);
    v_step   record;
BEGIN
    UPDATE cyclone.steps s
       SET status = CASE WHEN v_status = 'running' THEN 'uncertain' ELSE 'pending' END,
           available_at = NULL, lease_expires_at = NULL, effect_uncertain = true,
           unsafe = true
     WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'running'
       AND s.lease_token = p_lease_token AND s.lease_expires_at > v_now
    RETURNING s.status, s.attempt, s.action, s.started_at INTO v_step;
    IF NOT FOUND THEN
        SELECT s.status, s.lease_token, s.attempt INTO v_step
          FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                    v_step.lease_token, v_step.attempt);
    END IF;
    INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, details,
                                     retryable, at)
    VALUES (p_run_id, p_node, v_step.attempt, 'handler', coalesce(p_type, ''),
            coalesce(p_message, ''), coalesce(p_details, ''), false, v_now);
    IF v_step.status = 'uncertain' THEN
        PERFORM cyclone._run_block(p_run_id, jsonb_build_object(
            'kind', 'EffectUncertain',
            'message', format(
                'node %s (action %s) stopped at attempt %s, started %s, without an '
                'outcome (%s); its effect may have happened. Check, then Resolve '
                'with result, error or discard', p_node, v_step.action,
                v_step.attempt, v_step.started_at,
                left(concat_ws(': ', nullif(p_type, ''), nullif(p_message, '')), 200)),
            'node', p_node, 'attempt', v_step.attempt,
            'started_at', v_step.started_at), v_now);
        v_status := 'blocked';
    END IF;
    RETURN ROW(v_step.status, v_status, false, NULL)::cyclone.completion;
END;
$$;
-- _step_fail_unheld, and while the run is blocked a retry is held like the run's other
-- ready steps: pending, released by Resolve together with them (at once: the backoff
-- is not kept across the block), and the answer says pending with no retry_at.
-- For a durable function, the failure that ended its body is not kept in its journal:
-- the node's last entry (greatest seq), when it is a safe call's failure, is deleted,
-- so that the next attempt calls it again. A failure the body handled and went on from
-- (a later entry exists) stays, and unsafe entries are never deleted here.
-- RPC: Complete with a failure; also called by step_complete_many.
CREATE OR REPLACE FUNCTION cyclone.step_fail(
    p_run_id uuid, p_node text, p_lease_token uuid, p_type text, p_message text,
    p_details text, p_retryable boolean, p_retry_after interval)
RETURNS cyclone.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
    END IF;
    DELETE FROM cyclone.step_calls c
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.status = 'failed' AND NOT c.unsafe
       AND c.seq > ALL (SELECT o.seq FROM cyclone.step_calls o
                         WHERE o.run_id = p_run_id AND o.node = p_node
                           AND o.step_id <> c.step_id);
    RETURN v_done;
END;
$$;
-- Resolves a blocked run's uncertain step: result (the effect happened: the value is
-- its output, completed), error (it happened and failed: discarded, a resolved error
-- recorded, so failure-handling nodes run) or discard (it did not happen: available
-- again, with a fresh attempt budget as Retry grants). The run becomes running and the
-- steps held while it was blocked are released (_settle). The lease token of the
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

    UPDATE cyclone.runs SET status = 'running', error = NULL, updated_at = v_now
     WHERE run_id = p_run_id;
    -- Release what was held while blocked.
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
           SET status = 'available', available_at = v_now, effect_uncertain = false,
               lease_token = NULL, max_attempts = s.attempt + s.attempt_budget
         WHERE s.run_id = p_run_id AND s.node = p_node;
        PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
        PERFORM cyclone._settle(p_run_id, '{}', v_held, 0);
    ELSE
        RAISE EXCEPTION 'unknown resolution %', left(p_choice, 50) USING ERRCODE = 'CY004';
    END CASE;
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, p_node, 'resolve_' || p_choice, p_actor, coalesce(p_reason, ''),
            jsonb_build_object('attempt', v_step.attempt, 'value', p_value), v_now);
END;
$$;
-- step_claim returns one more column: dropped and created again.
DROP FUNCTION cyclone.step_claim(text, text[], text[], integer, interval);

-- Claims up to p_limit ready steps of the actions a worker serves, oldest
-- available_at first, each action once however often p_actions names it, with FOR
-- UPDATE SKIP LOCKED: two claims never get the same step. Each becomes running:
-- attempt + 1, a new random lease token, deadline = now + timeout, lease =
-- min(p_lease, timeout), unsafe = whether the worker marks its action unsafe.
-- A ready step whose last lease expired with no outcome (effect_uncertain) is not
-- handed to a worker that marks its action unsafe: _block_uncertain blocks its run,
-- and it is returned first with blocked = true (and no lease). A worker that does not
-- mark it unsafe claims it like any step, with effect_uncertain = true in the reply.
-- Each row carries the run's input, the completed upstream outputs, how long the step
-- waited (waited_s) and, for a step allowed to run after a failure, its failed or
-- skipped upstream nodes with their last errors (upstream_failures), and the node's
-- journal of step calls in seq order (NULL when it has none).
-- The claimed rows are updated by the ctids locked in the same statement and each
-- run read by key, so no plan scans steps; a generic plan is forced (the plan is the
-- same walk of the ready index for every argument, and replanning cost ~0.45 ms of a
-- 1.5 ms claim). RPC: Claim.
CREATE FUNCTION cyclone.step_claim(
    p_worker text, p_actions text[], p_unsafe text[], p_limit integer, p_lease interval)
RETURNS TABLE (
    run_id uuid, node text, action text, workflow text, attempt integer,
    max_attempts integer, input jsonb, run_input jsonb, upstream jsonb, lease_token uuid,
    lease_expires_at timestamptz, deadline_at timestamptz, progress jsonb,
    effect_uncertain boolean, blocked boolean, waited_s float8, upstream_failures jsonb,
    journal jsonb)
LANGUAGE plpgsql
-- The plan is the same walk of the ready index for every argument (see above).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := cyclone.now();
BEGIN
    IF cardinality(p_unsafe) > 0 THEN
        RETURN QUERY SELECT b.run_id, b.node, b.action, b.workflow, b.attempt, b.max_attempts,
                            NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::uuid,
                            NULL::timestamptz, NULL::timestamptz, NULL::jsonb, true, true,
                            NULL::float8, NULL::jsonb, NULL::jsonb
                       FROM cyclone._block_uncertain(p_unsafe) b;
    END IF;

    RETURN QUERY
    WITH picked AS (
        SELECT c.row_id, c.run_id, c.node, c.effect_uncertain, c.available_at
          FROM (SELECT DISTINCT x FROM unnest(p_actions) x) AS a(action)
         CROSS JOIN LATERAL (
               SELECT s.ctid AS row_id, s.run_id, s.node, s.available_at, s.effect_uncertain
                 FROM cyclone.steps s
                WHERE s.status = 'available' AND s.action = a.action
                  AND s.available_at <= v_now
                  AND NOT (s.effect_uncertain AND s.action = ANY (p_unsafe))
                ORDER BY s.available_at
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED) c
         ORDER BY c.available_at
         LIMIT p_limit
    ), claimed AS (
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
               effect_uncertain = false
         WHERE s.ctid = ANY (ARRAY(SELECT p.row_id FROM picked p))
           AND s.status = 'available'
        RETURNING s.run_id, s.node, s.action, s.attempt, s.max_attempts, s.input,
                  s.depends_on, s.deps_failed, s.lease_token, s.lease_expires_at,
                  s.deadline_at, s.progress
    )
    SELECT c.run_id, c.node, c.action, r.workflow, c.attempt, c.max_attempts, c.input,
           r.input,
           CASE WHEN cardinality(c.depends_on) > 0 THEN (
               SELECT jsonb_object_agg(u.node, u.output) FROM cyclone.steps u
                WHERE u.run_id = c.run_id AND u.node = ANY (c.depends_on)
                  AND u.status = 'completed') END,
           c.lease_token, c.lease_expires_at, c.deadline_at, c.progress,
           p.effect_uncertain, false, extract(epoch FROM v_now - p.available_at)::float8,
           CASE WHEN c.deps_failed > 0 THEN (
               SELECT jsonb_agg(jsonb_build_object(
                          'node', u.node, 'status', u.status,
                          'error', CASE WHEN u.status = 'discarded' THEN (
                              SELECT jsonb_build_object(
                                         'attempt', e.attempt, 'kind', e.kind, 'type', e.type,
                                         'message', e.message, 'details', e.details,
                                         'retryable', e.retryable, 'at', e.at)
                                FROM cyclone.step_errors e
                               WHERE e.run_id = u.run_id AND e.node = u.node
                               ORDER BY e.at DESC, e.attempt DESC LIMIT 1) END)
                      ORDER BY u.position)
                 FROM cyclone.steps u
                WHERE u.run_id = c.run_id AND u.node = ANY (c.depends_on)
                  AND u.status IN ('discarded', 'skipped')) END,
           -- One probe of the journal's key per claimed step.
           (SELECT jsonb_agg(cyclone._step_call_json(j) ORDER BY j.seq)
              FROM cyclone.step_calls j
             WHERE j.run_id = c.run_id AND j.node = c.node)
      FROM claimed c
      JOIN picked p ON p.run_id = c.run_id AND p.node = c.node
     -- OFFSET 0 keeps the lookup a subquery run once per claimed step, by key.
     CROSS JOIN LATERAL (SELECT r.workflow, r.input FROM cyclone.runs r
                          WHERE r.run_id = c.run_id OFFSET 0) r;
END;
$$;
-- Refuses a step call's identity that no SDK sends: step_id and function of 1 to 200
-- characters, none a control character; seq from 1 to 100000. CY004.
CREATE FUNCTION cyclone._step_call_check(p_step_id text, p_seq integer, p_function text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_step_id IS NULL OR length(p_step_id) NOT BETWEEN 1 AND 200
       OR p_step_id ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'step_id must be 1 to 200 printable characters'
            USING ERRCODE = 'CY004';
    END IF;
    IF p_function IS NULL OR length(p_function) NOT BETWEEN 1 AND 200
       OR p_function ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'function must be 1 to 200 printable characters'
            USING ERRCODE = 'CY004';
    END IF;
    IF p_seq IS NULL OR p_seq NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'seq must be between 1 and 100000, got %', p_seq
            USING ERRCODE = 'CY004';
    END IF;
END;
$$;
-- The attempt of a held step (running, this token, lease not expired), with its row
-- share-locked until the transaction ends when p_lock (a caller that writes the
-- journal); else the error _lease_lost raises (CY001, or CY002 for an unknown step).
CREATE FUNCTION cyclone._step_held(p_run_id uuid, p_node text, p_lease_token uuid,
                                   p_lock boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_step record;
BEGIN
    IF p_lock THEN
        SELECT s.attempt INTO v_step FROM cyclone.steps s
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'running'
           AND s.lease_token = p_lease_token AND s.lease_expires_at > cyclone.now()
           FOR SHARE;
    ELSE
        SELECT s.attempt INTO v_step FROM cyclone.steps s
         WHERE s.run_id = p_run_id AND s.node = p_node AND s.status = 'running'
           AND s.lease_token = p_lease_token AND s.lease_expires_at > cyclone.now();
    END IF;
    IF FOUND THEN
        RETURN v_step.attempt;
    END IF;
    SELECT s.status, s.lease_token, s.attempt INTO v_step
      FROM cyclone.steps s WHERE s.run_id = p_run_id AND s.node = p_node;
    PERFORM cyclone._lease_lost(p_run_id, p_node, p_lease_token, v_step.status,
                                v_step.lease_token, v_step.attempt);
    RETURN NULL;
END;
$$;
-- Refuses a new entry past the 10,000 a node's journal may hold (CY003).
CREATE FUNCTION cyclone._step_call_room(p_run_id uuid, p_node text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT count(*) FROM (SELECT 1 FROM cyclone.step_calls c
                               WHERE c.run_id = p_run_id AND c.node = p_node
                               LIMIT 10000) n) >= 10000 THEN
        RAISE EXCEPTION 'node % already has 10000 step calls in its journal, the limit',
            p_node USING ERRCODE = 'CY003';
    END IF;
END;
$$;
-- Begins a step call of the held step. Returns the decision, the run's status and the
-- entry (NULL for RUN of a safe call):
--   RECORDED   the call has an outcome: the caller replays it;
--   RUN        no outcome: for an unsafe call, an entry `started` is written first
--              (or was written by this same attempt: a repeated Begin); a safe call
--              writes nothing;
--   UNCERTAIN  an unsafe call whose `started` entry an earlier attempt left: its effect
--              may have happened. The node's lease ends; in a running run the node
--              becomes uncertain and the run blocked (EffectUncertain naming the node
--              and step_id; _run_block), in a blocked run it is held (pending,
--              effect_uncertain) and blocks the run again when it replays. The error
--              joins the node's history (kind handler, type EffectUncertain).
-- An unsafe call takes the run lock first, as Complete does. CY001 when the lease is
-- lost, CY004 for a bad identity, CY003 past the journal's limit. RPC: BeginStepCall.
CREATE FUNCTION cyclone.step_call_begin(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_function text, p_unsafe boolean)
RETURNS TABLE (decision text, run_status text, call jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_status  text;
    v_attempt integer;
    v_call    cyclone.step_calls;
    v_found   boolean;
    v_message text;
BEGIN
    PERFORM cyclone._step_call_check(p_step_id, p_seq, p_function);
    IF p_unsafe THEN
        v_status := cyclone._run_lock(p_run_id);
    END IF;
    v_attempt := cyclone._step_held(p_run_id, p_node, p_lease_token, p_unsafe);
    IF v_status IS NULL THEN
        SELECT r.status INTO v_status FROM cyclone.runs r WHERE r.run_id = p_run_id;
    END IF;
    SELECT * INTO v_call FROM cyclone.step_calls c
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id;
    v_found := FOUND;
    IF v_found AND v_call.status <> 'started' THEN
        RETURN QUERY SELECT 'recorded', v_status, cyclone._step_call_json(v_call);
        RETURN;
    END IF;
    IF NOT p_unsafe THEN
        RETURN QUERY SELECT 'run', v_status, NULL::jsonb;
        RETURN;
    END IF;
    IF NOT v_found THEN
        PERFORM cyclone._step_call_room(p_run_id, p_node);
        INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                             unsafe, attempt, started_at)
        VALUES (p_run_id, p_node, p_step_id, p_seq, p_function, 'started', true, v_attempt,
                v_now)
        RETURNING c.* INTO v_call;
        RETURN QUERY SELECT 'run', v_status, cyclone._step_call_json(v_call);
        RETURN;
    END IF;
    IF v_call.attempt = v_attempt THEN
        RETURN QUERY SELECT 'run', v_status, cyclone._step_call_json(v_call);
        RETURN;
    END IF;

    -- Started by an earlier attempt, no outcome: its effect may have happened.
    v_message := format(
        'node %s: step call %s (function %s) started at attempt %s, %s, with no outcome; '
        'its effect may have happened. Check, then Resolve with step_id %s and result, '
        'error or discard', p_node, p_step_id, v_call.function, v_call.attempt,
        v_call.started_at, p_step_id);
    UPDATE cyclone.steps s
       SET status = CASE WHEN v_status = 'running' THEN 'uncertain' ELSE 'pending' END,
           available_at = NULL, lease_expires_at = NULL, lease_token = NULL,
           effect_uncertain = true, unsafe = true
     WHERE s.run_id = p_run_id AND s.node = p_node;
    INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
    VALUES (p_run_id, p_node, v_attempt, 'handler', 'EffectUncertain', v_message, false,
            v_now);
    IF v_status = 'running' THEN
        PERFORM cyclone._run_block(p_run_id, jsonb_build_object(
            'kind', 'EffectUncertain', 'message', v_message, 'node', p_node,
            'attempt', v_call.attempt, 'started_at', v_call.started_at,
            'step_id', p_step_id, 'function', v_call.function), v_now);
        v_status := 'blocked';
    END IF;
    RETURN QUERY SELECT 'uncertain', v_status, cyclone._step_call_json(v_call);
END;
$$;
-- Ends a step call of the held step with its outcome: p_output (success; JSON null
-- when it returned nothing) or p_error ({type, message, details}), exactly one. A
-- `started` entry is updated in place (attempt, finished_at); with no entry one is
-- added (started_at = now); an entry that has an outcome already is left as it is and
-- answered with duplicate = true. CY001 when the lease is lost, CY004 for a bad
-- identity or outcome, CY003 past the journal's limit. RPC: EndStepCall (the server
-- commits a safe call's end without waiting for its flush: losing it only runs a safe
-- call again); also called by step_call_record.
CREATE FUNCTION cyclone._step_call_end(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_function text, p_unsafe boolean, p_output jsonb, p_error jsonb)
RETURNS TABLE (duplicate boolean, call jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_attempt integer;
    v_call    cyclone.step_calls;
BEGIN
    PERFORM cyclone._step_call_check(p_step_id, p_seq, p_function);
    IF (p_output IS NULL) = (p_error IS NULL) THEN
        RAISE EXCEPTION 'a step call ends with exactly one of output or error'
            USING ERRCODE = 'CY004';
    END IF;
    v_attempt := cyclone._step_held(p_run_id, p_node, p_lease_token, true);
    UPDATE cyclone.step_calls c
       SET status = CASE WHEN p_error IS NULL THEN 'succeeded' ELSE 'failed' END,
           output = p_output, error = p_error, attempt = v_attempt, finished_at = v_now
     WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id
       AND c.status = 'started'
    RETURNING c.* INTO v_call;
    IF NOT FOUND THEN
        SELECT * INTO v_call FROM cyclone.step_calls c
         WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id;
        IF FOUND THEN
            RETURN QUERY SELECT true, cyclone._step_call_json(v_call);
            RETURN;
        END IF;
        PERFORM cyclone._step_call_room(p_run_id, p_node);
        INSERT INTO cyclone.step_calls AS c (run_id, node, step_id, seq, function, status,
                                             unsafe, output, error, attempt, started_at,
                                             finished_at)
        VALUES (p_run_id, p_node, p_step_id, p_seq, p_function,
                CASE WHEN p_error IS NULL THEN 'succeeded' ELSE 'failed' END, p_unsafe,
                p_output, p_error, v_attempt, v_now, v_now)
        ON CONFLICT (run_id, node, step_id) DO NOTHING
        RETURNING c.* INTO v_call;
        IF NOT FOUND THEN
            SELECT * INTO v_call FROM cyclone.step_calls c
             WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id;
            RETURN QUERY SELECT true, cyclone._step_call_json(v_call);
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT false, cyclone._step_call_json(v_call);
END;
$$;
-- Records a step call's success inside a worker's own transaction, after its business
-- writes (docs/exactly-once.md), so that the call's Postgres effect commits with its
-- record, once: a repeat (the call has an outcome already) raises CY005 and a lost
-- lease CY001, and either rolls the business write back. An unsafe call's `started`
-- entry is updated in place. SECURITY DEFINER with a pinned search_path, executable by
-- cyclone_worker (90_roles.sql): the lease token is the capability. Not called by the
-- server.
CREATE FUNCTION cyclone.step_call_record(
    p_run_id uuid, p_node text, p_lease_token uuid, p_step_id text, p_seq integer,
    p_function text, p_output jsonb)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_done record;
BEGIN
    SELECT * INTO v_done FROM cyclone._step_call_end(
        p_run_id, p_node, p_lease_token, p_step_id, p_seq, p_function,
        EXISTS (SELECT 1 FROM cyclone.step_calls c
                 WHERE c.run_id = p_run_id AND c.node = p_node AND c.step_id = p_step_id
                   AND c.unsafe),
        coalesce(p_output, 'null'::jsonb), NULL);
    IF v_done.duplicate THEN
        RAISE EXCEPTION 'step call % of (%, %) already has an outcome', left(p_step_id, 200),
            p_run_id, p_node
            USING ERRCODE = 'CY005',
                  DETAIL = 'This call repeats a step call whose outcome was committed before.',
                  HINT = 'Roll back: the call''s effect was committed with its first record.';
    END IF;
    RETURN v_done.call;
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
CREATE FUNCTION cyclone.step_call_resolve(
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

    UPDATE cyclone.runs SET status = 'running', error = NULL, updated_at = v_now
     WHERE run_id = p_run_id;
    -- Release what was held while blocked.
    v_held := ARRAY(SELECT s.node FROM cyclone.steps s
                     WHERE s.run_id = p_run_id AND s.status = 'pending' AND s.deps_open = 0);
    UPDATE cyclone.steps s
       SET status = 'available', available_at = v_now, effect_uncertain = false,
           lease_token = NULL, max_attempts = s.attempt + s.attempt_budget
     WHERE s.run_id = p_run_id AND s.node = v_node;
    PERFORM cyclone._notify_ready(ARRAY[v_step.action]);
    PERFORM cyclone._settle(p_run_id, '{}', v_held, 0);
    INSERT INTO cyclone.audit (run_id, node, action, actor, reason, details, at)
    VALUES (p_run_id, v_node, 'resolve_' || p_choice, p_actor, coalesce(p_reason, ''),
            jsonb_build_object('attempt', v_step.attempt, 'step_id', p_step_id,
                               'value', p_value),
            v_now);
    RETURN v_node;
END;
$$;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA cyclone FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cyclone.step_call_record(uuid, text, uuid, text, integer, text, jsonb)
    TO cyclone_worker;
