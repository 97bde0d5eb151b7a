-- Cyclone schema, version 1: tables and invariants.
--
-- The statuses and the functions that set each one, as they are now, are listed in
-- service/schema/00_tables.sql (the engine's current definition); docs/state-machine.md
-- draws them.

CREATE TABLE cyclone.runs (
    run_id       uuid        PRIMARY KEY,
    workflow     text        NOT NULL,
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
    CONSTRAINT runs_status_known
        CHECK (status IN ('running', 'completed', 'failed', 'blocked', 'cancelled')),
    CONSTRAINT runs_finished_at_iff_finished
        CHECK ((status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT runs_error_iff_failed_or_blocked
        CHECK ((status IN ('failed', 'blocked')) = (error IS NOT NULL)),
    CONSTRAINT runs_steps_open_in_range CHECK (steps_open BETWEEN 0 AND steps_total),
    CONSTRAINT runs_open_iff_unfinished
        CHECK ((steps_open = 0) = (status IN ('completed', 'failed', 'cancelled'))),
    CONSTRAINT runs_workflow_submit_key_unique UNIQUE (workflow, submit_key)
);

CREATE INDEX runs_created_idx ON cyclone.runs (created_at DESC, run_id DESC);
CREATE INDEX runs_workflow_created_idx ON cyclone.runs (workflow, created_at DESC, run_id DESC);
CREATE INDEX runs_status_created_idx ON cyclone.runs (status, created_at DESC, run_id DESC)
    WHERE status <> 'completed';

CREATE TABLE cyclone.steps (
    run_id             uuid        NOT NULL REFERENCES cyclone.runs ON DELETE CASCADE,
    node               text        NOT NULL,
    -- Topological position, for display.
    position           integer     NOT NULL,
    action             text        NOT NULL,
    status             text        NOT NULL,
    trigger_rule       text        NOT NULL,
    depends_on         text[]      NOT NULL,
    dependents         text[]      NOT NULL,
    -- Upstream steps not yet final, and those of them that ended discarded or skipped.
    deps_open          integer     NOT NULL,
    deps_failed        integer     NOT NULL DEFAULT 0,
    attempt            integer     NOT NULL DEFAULT 0,
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
    PRIMARY KEY (run_id, node),
    CONSTRAINT steps_status_known CHECK (status IN
        ('pending', 'available', 'running', 'completed', 'discarded', 'uncertain',
         'skipped', 'cancelled')),
    CONSTRAINT steps_trigger_rule_known
        CHECK (trigger_rule IN ('all_success', 'all_done', 'one_failed')),
    CONSTRAINT steps_finished_at_iff_final
        CHECK ((status IN ('completed', 'discarded', 'skipped', 'cancelled'))
               = (finished_at IS NOT NULL)),
    CONSTRAINT steps_available_has_time CHECK (status <> 'available' OR available_at IS NOT NULL),
    CONSTRAINT steps_running_has_lease CHECK (status <> 'running' OR
        (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL AND deadline_at IS NOT NULL)),
    CONSTRAINT steps_deps_in_range
        CHECK (deps_open >= 0 AND deps_failed >= 0
               AND deps_open + deps_failed <= cardinality(depends_on)),
    CONSTRAINT steps_attempts_in_range CHECK (attempt >= 0 AND max_attempts >= 1),
    CONSTRAINT steps_output_only_completed CHECK (output IS NULL OR status = 'completed')
);

-- The claim's index: exactly the ready rows, per action, oldest first. Claimed rows
-- leave it, so a long drain does not walk over what it already took.
CREATE INDEX steps_ready_idx ON cyclone.steps (action, available_at) WHERE status = 'available';
-- Ready rows whose last attempt lost its lease: checked against unsafe marks at claim.
CREATE INDEX steps_uncertain_idx ON cyclone.steps (action)
    WHERE status = 'available' AND effect_uncertain;
-- The sweep's index: held leases by expiry.
CREATE INDEX steps_leased_idx ON cyclone.steps (lease_expires_at) WHERE status = 'running';

CREATE TABLE cyclone.step_errors (
    run_id    uuid        NOT NULL,
    node      text        NOT NULL,
    attempt   integer     NOT NULL,
    -- handler | lease_expired | resolved
    kind      text        NOT NULL,
    type      text        NOT NULL DEFAULT '',
    message   text        NOT NULL DEFAULT '',
    details   text        NOT NULL DEFAULT '',
    retryable boolean     NOT NULL,
    at        timestamptz NOT NULL,
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE,
    CONSTRAINT step_errors_kind_known CHECK (kind IN ('handler', 'lease_expired', 'resolved'))
);
CREATE INDEX step_errors_step_idx ON cyclone.step_errors (run_id, node, at);

CREATE TABLE cyclone.audit (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id  uuid        NOT NULL REFERENCES cyclone.runs ON DELETE CASCADE,
    node    text        NOT NULL DEFAULT '',
    action  text        NOT NULL,
    actor   text        NOT NULL,
    reason  text        NOT NULL DEFAULT '',
    details jsonb,
    at      timestamptz NOT NULL
);
CREATE INDEX audit_run_idx ON cyclone.audit (run_id, id);

-- Time, read through one function so that tests can move it instead of sleeping.
CREATE TABLE cyclone.clock (
    singleton boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    offset_by interval NOT NULL DEFAULT '0'
);
INSERT INTO cyclone.clock DEFAULT VALUES;

CREATE FUNCTION cyclone.now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT now() + offset_by FROM cyclone.clock
$$;

CREATE TYPE cyclone.completion AS (
    step_status text,
    run_status  text,
    duplicate   boolean,
    retry_at    timestamptz
);
