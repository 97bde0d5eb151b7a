-- Cyclone's engine, as it is now: tables, indexes, constraints, types and the clock.
--
-- The files of service/schema/ are the current definition of the engine, applied in
-- name order to create a fresh database (service.migrate.apply_schema). A live database
-- gets to the same state through service/migrations/; tests/test_schema.py proves that
-- both give the same database. To change the engine, edit these files AND add a
-- migration (CONTRIBUTING.md).
--
-- The schema itself and cyclone.schema_migrations (the versions applied) are created by
-- service/migrate.py before any of this runs.
--
-- Invariants are CHECK constraints; every transition is a function of the later files,
-- which locks what it changes and guards each row by its from-state.

-- One run of a workflow: one row per Submit (or per SubmitOnce key).
--
-- Run statuses, and the functions that set each one (docs/state-machine.md draws them):
--   running    run_submit; step_retry (from failed or running); step_resolve and
--              step_call_resolve (from blocked)
--   completed  _runs_close, when the last open step of a running run becomes final and
--              none is discarded (through _settle, _run_close or step_complete_many)
--   failed     _runs_close, as above, with one or more steps discarded; error
--              StepDiscarded names the first discarded node
--   blocked    _block_uncertain (step_claim: an uncertain step met a worker that marks its
--              action unsafe); step_abandon (an unsafe handler stopped with no outcome);
--              step_call_begin (an unsafe step call an earlier attempt started has no
--              outcome); all through _run_block; error EffectUncertain names the node
--              and attempt, and the step_id of a step call
--   cancelled  run_cancel (from running, failed or blocked; and, unless told to keep
--              them, its running or blocked descendant runs, through _run_cancel_one)
-- A running or blocked run may also be paused (paused_at set: run_pause, cleared by
-- run_resume), which is not a status: its steps that would be available are held
-- pending (with the time they are due kept in available_at) until it is resumed.
CREATE TABLE cyclone.runs (
    run_id       uuid        PRIMARY KEY,
    workflow     text        NOT NULL,
    -- The SubmitOnce key, for display and ListRuns; cyclone.submit_keys makes it unique.
    submit_key   text,
    status       text        NOT NULL,
    input        jsonb,
    error        jsonb,
    steps_total  integer     NOT NULL,
    -- Steps not in a final status; the run finishes when it reaches zero.
    steps_open   integer     NOT NULL,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    -- A child run (child_start, 48_children.sql): the node of the parent run whose
    -- durable function started it, and that step call of its journal. NULL for a run a
    -- client submitted. run_cancel cancels a run's children with it.
    parent_run_id  uuid,
    parent_node    text,
    parent_step_id text,
    -- The run's claim priority (Submit), every step's unless its node overrides it.
    priority     integer     NOT NULL DEFAULT 0,
    -- The start time given to Submit (root steps available then); NULL: at once.
    start_at     timestamptz,
    -- The run's tags given to Submit: a JSON object of key = value strings (validated and
    -- capped by the server), NULL for none; cyclone.run_tags holds them too, a row each.
    -- Fixed at submit; changed after only by an operator (run_tags_set, audited).
    tags         jsonb,
    -- The run's time limit given to Submit; NULL: none.
    deadline     timestamptz,
    -- The W3C traceparent of the submitting client's span, NULL when tracing is off.
    traceparent  text,
    -- A pause (run_pause, 75_pauses.sql): when, by whom and why; all NULL while the run
    -- is not paused. While it is paused the steps it makes ready stay pending, so that
    -- no claim reads them, until run_resume.
    paused_at    timestamptz,
    paused_by    text,
    pause_reason text,
    -- What each status implies, in one constraint: a known status; finished_at set
    -- exactly when finished (completed, failed, cancelled); an error exactly when failed
    -- or blocked; no step open exactly when finished; steps_open within 0 and
    -- steps_total. One constraint rather than five, its lists written as array
    -- constants: PostgreSQL reads every CHECK expression again (from its stored node
    -- text) in each statement that writes the table, and evaluates each one per row,
    -- and the close of a run is on every run's path (docs/performance.md, "The
    -- engine's SQL").
    CONSTRAINT runs_status_valid CHECK (
        status = ANY ('{running,completed,failed,blocked,cancelled}'::text[])
        AND (finished_at IS NOT NULL) = (status = ANY ('{completed,failed,cancelled}'::text[]))
        AND (error IS NOT NULL) = (status = ANY ('{failed,blocked}'::text[]))
        AND (steps_open = 0) = (finished_at IS NOT NULL)
        AND steps_open >= 0 AND steps_open <= steps_total)
)
-- Room on each page for the new versions of its rows. A transition changes status, so
-- no update of a run or a step is HOT (status is in the partial indexes' conditions);
-- but a new version that fits on its old row's page is written without a lock record
-- for the old one, with only the changed bytes logged, and without touching another
-- page. A one-node run is updated once (closed), a step twice (claimed, completed); at
-- 60 most of those stay on their page (docs/performance.md, "The engine's SQL").
-- The cost: pages of finished rows stay partly empty.
WITH (fillfactor = 60);

-- ListRuns' orders and filters.
CREATE INDEX runs_created_idx ON cyclone.runs (created_at DESC, run_id DESC);
CREATE INDEX runs_workflow_created_idx ON cyclone.runs (workflow, created_at DESC, run_id DESC);
CREATE INDEX runs_status_created_idx ON cyclone.runs (status, created_at DESC, run_id DESC)
    WHERE status <> 'completed';
-- The completed runs, which runs_status_created_idx leaves out: CountRuns counts them
-- (up to its limit) from the newest, reading this index only, whatever else is newer.
CREATE INDEX runs_completed_created_idx ON cyclone.runs (created_at DESC, run_id DESC)
    WHERE status = 'completed';
-- ListRuns' and CountRuns' key filter, with or without a workflow: an exact key, or a
-- prefix (LIKE 'prefix%', a range of this index in any collation: text_pattern_ops
-- compares byte by byte, migration 0051).
CREATE INDEX runs_key_idx ON cyclone.runs (submit_key text_pattern_ops, workflow)
    WHERE submit_key IS NOT NULL;
-- Retention (runs_purge): exactly the runs each policy may delete, oldest first, so a
-- batch reads off the front of an index however many runs are kept.
CREATE INDEX runs_finished_idx ON cyclone.runs (finished_at)
    WHERE status IN ('completed', 'cancelled');
CREATE INDEX runs_failed_idx ON cyclone.runs (finished_at) WHERE status = 'failed';
-- A run's children: run_cancel walks down a run's descendants by it.
CREATE INDEX runs_parent_idx ON cyclone.runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

-- The stored state of one node of a run; (run_id, node) is its key for its whole life.
--
-- Step statuses, and the functions that set each one:
--   pending    run_submit (the node has upstream nodes); step_retry (the retried nodes
--              and every node below them that has not completed); held while the run is
--              paused though ready: by run_pause (its available steps, available_at
--              kept), by _settle, step_fail, sweep_steps, steps_release, step_wait,
--              step_resolve and step_call_resolve (what they would make available);
--              held while the run is
--              blocked though ready (deps_open = 0): by _block_uncertain and
--              step_abandon when they block the run (its available steps), by _settle
--              (a step that becomes ready), by step_fail (a retryable failure) and by
--              step_abandon and step_call_begin in a run already blocked (with
--              effect_uncertain)
--   available  run_submit (root node); _settle (upstream final, trigger rule met, run
--              running); step_fail (retryable, attempts left: after the backoff);
--              sweep_steps (lease expired, attempts left or action marked unsafe);
--              step_resolve discard; step_call_resolve (any choice: the node replays); steps_release (service/db/claim.sql: a claim
--              whose caller went away); step_wait (the node waits: available from its
--              wake time; pending while the run is blocked)
--   running    step_claim
--   completed  _step_complete (step_complete, step_complete_many); step_complete_many's
--              set-based pass; step_resolve result
--   discarded  step_fail (non-retryable or out of attempts); sweep_steps (out of
--              attempts, action not marked unsafe); step_resolve error
--   uncertain  _block_uncertain (step_claim: an unsafe action's lease expired with no
--              outcome); step_abandon (an unsafe handler stopped without an outcome);
--              step_call_begin (an unsafe step call left started by an earlier attempt)
--   skipped    _settle (trigger rule can no longer be met)
--   cancelled  run_cancel (through _run_cancel_one: the cancelled run's and its
--              cancelled descendants' unfinished steps)
CREATE TABLE cyclone.steps (
    run_id             uuid        NOT NULL REFERENCES cyclone.runs ON DELETE CASCADE,
    -- Node names, here and in every table keyed by (run_id, node), compare byte by byte
    -- (COLLATE "C"): within a run the primary key orders its steps by name, and with the
    -- database's collation each comparison was a strcoll() call, 4 % of a fan-out's
    -- instructions per step (migration 0042, docs/performance.md). For UTF-8 the order
    -- is that of code points, the order of C.UTF-8.
    node               text        COLLATE "C" NOT NULL,
    -- Topological position, for display.
    position           integer     NOT NULL,
    action             text        NOT NULL,
    status             text        NOT NULL,
    trigger_rule       text        NOT NULL,
    depends_on         text[]      COLLATE "C" NOT NULL,
    dependents         text[]      COLLATE "C" NOT NULL,
    -- Upstream steps not yet final, and those of them that ended discarded or skipped.
    deps_open          integer     NOT NULL,
    deps_failed        integer     NOT NULL DEFAULT 0,
    -- +1 at every claim, never less: every claim ever made of the node.
    attempt            integer     NOT NULL DEFAULT 0,
    -- The attempt up to which the node may run (Retry and Resolve discard move it).
    max_attempts       integer     NOT NULL,
    initial_backoff    interval    NOT NULL,
    max_backoff        interval    NOT NULL,
    backoff_multiplier float8      NOT NULL,
    timeout            interval    NOT NULL,
    input              jsonb,
    output             jsonb,
    progress           jsonb,
    -- Not before, while available.
    available_at       timestamptz,
    -- The current (or last) lease. The token is kept after completion so that a
    -- repeated Complete with it is recognised.
    lease_token        uuid,
    lease_expires_at   timestamptz,
    deadline_at        timestamptz,
    worker_id          text,
    started_at         timestamptz,
    -- The worker holding (or that last held) the step marked its action unsafe.
    unsafe             boolean     NOT NULL DEFAULT false,
    -- An attempt lost its lease with no outcome: its effect may have happened.
    effect_uncertain   boolean     NOT NULL DEFAULT false,
    finished_at        timestamptz,
    -- When the holder of the lease last showed signs of life: step_claim, step_heartbeat.
    last_heartbeat_at  timestamptz,
    -- What an operator's Retry (or Resolve discard) grants: max_attempts becomes
    -- attempt - resumes - recoveries + attempt_budget. The node's retry policy, set at
    -- submit.
    attempt_budget     integer     NOT NULL,
    -- Claims that resumed the node after it waited (step_wait suspended it): counted in
    -- attempt, but not against max_attempts (step_fail and the sweep compare
    -- attempt - resumes - recoveries).
    resumes            integer     NOT NULL DEFAULT 0,
    -- What the node waits for while step_wait has it available at its wake time:
    -- "sleep", "event <name>", "child <run_id>". Cleared when the wait is over.
    waiting_for        text,
    -- Claim order: higher first, then oldest available_at (Node.priority, else the run's).
    priority           integer     NOT NULL DEFAULT 0,
    -- Node.concurrency evaluated at submit: at most concurrency_limit steps with this key
    -- are running at once (step_claim). Both NULL for a node with no limit.
    concurrency_key    text,
    concurrency_limit  integer,
    -- Attempts whose worker was lost: their lease lapsed before the step's deadline with
    -- no outcome (sweep_steps). Counted in attempt, but not against max_attempts; against
    -- the server's recovery budget instead (--max-recoveries).
    recoveries         integer     NOT NULL DEFAULT 0,
    -- The build of the worker whose claim started the node's body (its journal), set by
    -- the claim: a node with a journal is handed only to workers of a build compatible
    -- with it (_build_admits, 32_builds.sql). NULL: claimed by a worker without a build,
    -- or never claimed. build_move changes it.
    build_id           text,
    PRIMARY KEY (run_id, node),
    -- What each status implies, and the counts (two constraints rather than ten, as for
    -- runs): a known status; finished_at set exactly in a final status (completed,
    -- discarded, skipped, cancelled); an output only when completed; a time when
    -- available; a lease (token, expiry, deadline) when running.
    CONSTRAINT steps_status_valid CHECK (
        status = ANY ('{pending,available,running,completed,discarded,uncertain,skipped,cancelled}'::text[])
        AND (finished_at IS NOT NULL)
            = (status = ANY ('{completed,discarded,skipped,cancelled}'::text[]))
        AND (output IS NULL OR status = 'completed')
        AND (available_at IS NOT NULL OR status <> 'available')
        AND (status <> 'running' OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL
                                     AND deadline_at IS NOT NULL))),
    -- A known trigger rule, and the counts in range: open and failed upstream steps
    -- never below 0, max_attempts and attempt_budget at least 1, resumes and recoveries
    -- at least 0 and together at most attempt (so attempt is 0 or more). The counts' upper bound (their sum at most
    -- cardinality(depends_on)) is not checked here: it read the whole depends_on at
    -- every update of the row, and a join's is compressed in TOAST, so each count of a
    -- batch of leaves at a 10,000-wide join decompressed 10,000 names (3 % of a fan
    -- step; migration 0043). The counts are set from the graph at submit and by Retry.
    CONSTRAINT steps_counts_in_range CHECK (
        trigger_rule = ANY ('{all_success,all_done,one_failed}'::text[])
        AND deps_open >= 0 AND deps_failed >= 0
        AND max_attempts >= 1 AND attempt_budget >= 1
        AND resumes >= 0 AND recoveries >= 0 AND resumes + recoveries <= attempt)
)
-- Room for the claim's and the completion's versions of a row on its page: see runs.
WITH (fillfactor = 60);

-- The claim's index: exactly the ready rows, per action, highest priority first, then
-- oldest first. Claimed rows leave it, so a long drain does not walk over what it
-- already took.
CREATE INDEX steps_ready_idx ON cyclone.steps (action, priority DESC, available_at)
    WHERE status = 'available';
-- Running steps by concurrency key: step_claim counts them (_keys_room). Steps with no
-- key are not in it.
CREATE INDEX steps_key_running_idx ON cyclone.steps (concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;
-- Ready rows whose last attempt lost its lease: checked against unsafe marks at claim.
CREATE INDEX steps_uncertain_idx ON cyclone.steps (action)
    WHERE status = 'available' AND effect_uncertain;
-- The sweep's index: held leases by expiry. Only the sweep should walk it. A lookup of
-- one held step by key writes its lease check as
--     CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END
-- because with status = 'running' and an expiry range in plain sight, a planner whose
-- statistics saw few running steps walks this index (every running step) for each
-- lookup instead of the primary key: under load, most of Postgres's work per step.
-- Its predicate also names lease_expires_at (always set on a running step), which a
-- query must state, or imply with a range on it, to use the index: the claim's list of
-- full concurrency keys (status = 'running' AND concurrency_key IS NOT NULL) then
-- cannot walk it instead of steps_key_running_idx, as PostgreSQL 15 sometimes did with
-- fresh statistics. The reads of every running step (ListSteps, ListWorkers, Explain,
-- the metrics) state it.
CREATE INDEX steps_leased_idx ON cyclone.steps (lease_expires_at)
    WHERE status = 'running' AND lease_expires_at IS NOT NULL;
-- Steps backing off after a failed or lost attempt, soonest due first (ListSteps):
-- few rows (a failure puts a step in it, its next claim takes it out).
CREATE INDEX steps_backoff_idx ON cyclone.steps (available_at)
    WHERE status = 'available' AND attempt > 0 AND waiting_for IS NULL;
-- The unfinished steps of each build (ListBuilds, build_move): none while no worker
-- declares a build, so a claim of such steps never writes to it.
CREATE INDEX steps_build_idx ON cyclone.steps (build_id)
    WHERE build_id IS NOT NULL AND finished_at IS NULL;
-- A run's discarded steps, first first: _runs_close finds a failed run's error by key.
CREATE INDEX steps_discarded_idx ON cyclone.steps (run_id, finished_at, node)
    WHERE status = 'discarded';

-- Every failed or ended attempt of a step, oldest first: its error history.
CREATE TABLE cyclone.step_errors (
    run_id    uuid        NOT NULL,
    node      text        COLLATE "C" NOT NULL,
    attempt   integer     NOT NULL,
    -- handler (step_fail, step_abandon) | lease_expired (sweep_steps: type WorkerLost
    -- when the lease lapsed before the deadline, LeaseExpired at the deadline) |
    -- resolved (step_resolve error) | reset (step_retry revoked a lease below a retry)
    kind      text        NOT NULL,
    type      text        NOT NULL DEFAULT '',
    message   text        NOT NULL DEFAULT '',
    details   text        NOT NULL DEFAULT '',
    retryable boolean     NOT NULL,
    at        timestamptz NOT NULL,
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE,
    CONSTRAINT step_errors_kind_known
        CHECK (kind IN ('handler', 'lease_expired', 'resolved', 'reset'))
);
CREATE INDEX step_errors_step_idx ON cyclone.step_errors (run_id, node, at);

-- The journal of a node whose handler is a durable function: one row per step call,
-- unique by (run_id, node, step_id). Deleted with its step (and so with its run).
--
-- Step call statuses, and the functions that set each one:
--   started    step_call_begin (an unsafe call, before its function runs)
--   succeeded  _step_call_end (EndStepCall, step_call_record); step_call_resolve result;
--              step_wait (a wait that is over)
--   failed     _step_call_end; step_call_resolve error (type EffectFailed); step_wait
--              (EventTimeout)
--   waiting    step_wait (a wait that is not over; the node gave up its lease)
-- Deleted by step_fail (the trailing safe failure that ended an attempt) and by
-- step_call_resolve discard.
CREATE TABLE cyclone.step_calls (
    run_id      uuid        NOT NULL,
    node        text        COLLATE "C" NOT NULL,
    -- Stable across replays: "charge_order", "charge_order#2", or a name given.
    step_id     text        COLLATE "C" NOT NULL,
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
    -- A wait (47_waits.sql): when its node looks again unwoken (NULL: no limit), and
    -- what it waits for ("sleep", "event <name>", "child <run_id>").
    wake_at     timestamptz,
    waiting_for text,
    -- The digest of the call's arguments its worker recorded (SHA-256, 64 lowercase
    -- hexadecimal characters; docs/other-languages.md), NULL when none was: a replay
    -- compares it with the digest of the arguments it calls with now.
    args_digest text,
    PRIMARY KEY (run_id, node, step_id),
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE,
    CONSTRAINT step_calls_status_known
        CHECK (status IN ('started', 'succeeded', 'failed', 'waiting')),
    CONSTRAINT step_calls_output_iff_succeeded CHECK ((output IS NOT NULL) = (status = 'succeeded')),
    CONSTRAINT step_calls_error_iff_failed CHECK ((error IS NOT NULL) = (status = 'failed')),
    CONSTRAINT step_calls_finished_at_iff_outcome
        CHECK ((finished_at IS NOT NULL) = (status NOT IN ('started', 'waiting'))),
    CONSTRAINT step_calls_waiting_is_a_wait CHECK (status <> 'waiting' OR waiting_for IS NOT NULL),
    CONSTRAINT step_calls_seq_in_range CHECK (seq BETWEEN 1 AND 100000),
    CONSTRAINT step_calls_args_digest_hex CHECK (args_digest ~ '^[0-9a-f]{64}$')
);

-- A wide release in progress: a node that became final alone with more dependents than
-- one transaction counts (cyclone._settle, RELEASE_CHUNK in 10_internals.sql) had the
-- first of them counted with it; the rest, from position next of its dependents on,
-- are counted a chunk per transaction by cyclone.release_continue, which the servers
-- run as soon as this row is committed (woken by the name cyclone.release), and at
-- their start and every sweep interval (a server that stopped half way). At most one
-- row per run: a second wide node that becomes final meanwhile is counted whole.
-- Retry counts its nodes again from the graph, so it finishes the run's release first.
-- A small table apart from runs and steps, written only for such a node: the one-node
-- runs and the claims pay nothing for it. Keyed by run_id (shard-ready for Citus).
CREATE TABLE cyclone.releases (
    run_id     uuid        PRIMARY KEY,
    node       text        COLLATE "C" NOT NULL,
    next       integer     NOT NULL CHECK (next > 1),
    created_at timestamptz NOT NULL,
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE
);

-- A run's tags, one row each, as runs.tags holds them (written with it: run_submit,
-- run_tags_set): ListRuns' and CountRuns' tag filter walks run_tags_idx from one tag's
-- newest run, in the runs' order (created_at, run_id), and stops at the page's end,
-- however many runs carry the tag. Deleted with its run.
CREATE TABLE cyclone.run_tags (
    run_id     uuid        NOT NULL REFERENCES cyclone.runs ON DELETE CASCADE,
    key        text        NOT NULL,
    value      text        NOT NULL,
    -- The run's created_at, copied: the index orders a tag's runs as ListRuns does.
    created_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX run_tags_idx ON cyclone.run_tags (key, value, created_at DESC, run_id DESC);

-- Operator actions (retry, retry_all, resolve_*, cancel, pause, resume, set_tags), who
-- made them and why. Keyed by run_id first, as every run-level table (a key must contain
-- the shard key on Citus).
CREATE TABLE cyclone.audit (
    id      bigint      GENERATED ALWAYS AS IDENTITY,
    run_id  uuid        NOT NULL REFERENCES cyclone.runs ON DELETE CASCADE,
    node    text        NOT NULL DEFAULT '',
    action  text        NOT NULL,
    actor   text        NOT NULL,
    reason  text        NOT NULL DEFAULT '',
    details jsonb,
    at      timestamptz NOT NULL,
    PRIMARY KEY (run_id, id)
);

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

-- Per action, the last Claim that asked for it and the last one that got a step of it
-- (Explain: "no worker serves this action"). Written by each server from memory every
-- few seconds (service/engine/activity.py, the named query action_claims_note), never by the
-- claim itself, so it costs the claim's plan nothing.
CREATE TABLE cyclone.action_claims (
    action     text        PRIMARY KEY,
    -- Last Claim that named this action (a worker serving it asked for work), and who.
    polled_at  timestamptz NOT NULL,
    polled_by  text        NOT NULL,
    -- Last Claim that handed out a step of this action, and to whom.
    claimed_at timestamptz,
    claimed_by text,
    CONSTRAINT action_claims_claimed_by_iff_claimed
        CHECK ((claimed_at IS NULL) = (claimed_by IS NULL))
);

-- Workers whose lease lapsed with no outcome before the step's deadline (sweep_steps):
-- the worker died, froze or lost its connection. A worker listed here is handed no step
-- (step_claim, and the server before a sharded claim) until it shows it is alive: its
-- next Claim or message on its Work stream removes its row (service/db/workers.sql,
-- worker_alive). ListWorkers shows it as unhealthy.
CREATE TABLE cyclone.worker_health (
    worker_id       text        COLLATE "C" PRIMARY KEY,
    unhealthy_since timestamptz NOT NULL,
    -- What made it unhealthy: the first step whose lease lapsed.
    reason          text        NOT NULL DEFAULT ''
);

-- The workers the servers saw ask for work (a Claim, or a claim of a Work stream): the
-- actions they serve, their build, when last (ListWorkers lists them, idle or not).
-- Written by each server from memory every few seconds (service/engine/activity.py, the
-- named query workers_seen_note), never by the claim; a worker not seen for a day is
-- forgotten by the same statement.
CREATE TABLE cyclone.workers_seen (
    worker_id text        COLLATE "C" PRIMARY KEY,
    actions   text[]      NOT NULL,
    build_id  text,
    seen_at   timestamptz NOT NULL
);

-- SubmitOnce keys, kept apart from the runs so that retention can delete a run and
-- still answer its key with the run it made (submit_keys_purge deletes a key only once
-- its run is gone). A key is found by its id, submit_key_id(workflow, key), a
-- name-based UUID, and the primary key on it is what makes a key unique per workflow.
-- A keyed run made since migration 0027 has that id as its run_id, so on Citus its key
-- lives on its run's shard (docs/scaling.md); run_id differs from key_id only for keys
-- made before.
CREATE TABLE cyclone.submit_keys (
    workflow   text        NOT NULL,
    submit_key text        NOT NULL,
    run_id     uuid        NOT NULL,
    created_at timestamptz NOT NULL,
    key_id     uuid        PRIMARY KEY
);
CREATE INDEX submit_keys_created_idx ON cyclone.submit_keys (created_at);

-- Time, read through one function so that tests can move it instead of sleeping.
CREATE TABLE cyclone.clock (
    singleton boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    offset_by interval NOT NULL DEFAULT '0'
);
INSERT INTO cyclone.clock DEFAULT VALUES;

-- Every transition reads the time here: the time of the current statement (not of the
-- transaction) plus the clock's offset, which only tests change. A worker's completion
-- transaction may begin long before it calls step_complete; on the statement's clock
-- the lease is checked when the call is made.
CREATE FUNCTION cyclone.now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT statement_timestamp() + offset_by FROM cyclone.clock
$$;

-- The id of a SubmitOnce key, and of the run it makes: a name-based UUID (version 8,
-- RFC 9562) of the first 16 bytes of SHA-256 over a fixed prefix, the workflow name, a
-- NUL and the key (neither can contain NUL). Deterministic, so a run's primary key
-- enforces one run per key on whichever shard holds it (docs/scaling.md).
-- service.db.runs.submit_key_id computes the same. Called by run_submit.
CREATE FUNCTION cyclone.submit_key_id(p_workflow text, p_submit_key text) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT encode(set_byte(set_byte(d, 6, (get_byte(d, 6) & 15) | 128),
                           8, (get_byte(d, 8) & 63) | 128), 'hex')::uuid
      FROM (SELECT substring(sha256('cyclone submit key'::bytea || '\x00'::bytea
                                    || convert_to(p_workflow, 'UTF8') || '\x00'::bytea
                                    || convert_to(p_submit_key, 'UTF8')) FROM 1 FOR 16)) AS h(d)
$$;

-- What the Complete transitions (_step_complete, step_complete, step_fail, step_abandon)
-- return: the step's and the run's status after it, whether it repeated a completion
-- already recorded, and when a retry becomes claimable.
CREATE TYPE cyclone.completion AS (
    step_status text,
    run_status  text,
    duplicate   boolean,
    retry_at    timestamptz
);
