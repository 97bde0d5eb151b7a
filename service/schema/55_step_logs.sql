-- Step logs: the lines a handler logged, sent by its worker with Heartbeat and Complete
-- (HeartbeatRequest.logs, CompleteRequest.logs) and kept per attempt, so that an
-- operator reads what attempt 2 said without the worker's stdout (GetRun with logs,
-- `cyclone logs RUN NODE`).
--
-- Keyed by run_id first, as every step-level table: a run's logs live on its shard. Each
-- attempt keeps at most 1000 lines and 256 KiB of text; the first line past either cap
-- is replaced by one marker line (seq 1001, level WARNING) and the rest of the attempt's
-- lines are dropped. Deleted with their step, and so with their run (retention).
CREATE TABLE cyclone.step_logs (
    run_id  uuid        NOT NULL,
    node    text        COLLATE "C" NOT NULL,
    attempt integer     NOT NULL,
    -- Position within the attempt, 1 for the first line; 1001 is the cap's marker.
    seq     integer     NOT NULL,
    at      timestamptz NOT NULL,
    level   text        NOT NULL,
    logger  text        NOT NULL DEFAULT '',
    message text        NOT NULL,
    PRIMARY KEY (run_id, node, attempt, seq),
    FOREIGN KEY (run_id, node) REFERENCES cyclone.steps ON DELETE CASCADE,
    CONSTRAINT step_logs_seq_in_range CHECK (seq BETWEEN 1 AND 1001)
);

-- Appends log lines to held steps: p_items is [{run_id, node, lease_token, lines: [{at,
-- level, logger, message}]}]. Lines of a step whose lease is not held (lost, expired,
-- unknown) are dropped silently: the Heartbeat or Complete in the same transaction
-- reports the lost lease. Stored under the lease's attempt, within the caps above.
-- Called in the transaction of a Heartbeat or a completion that carries lines, before
-- it (a completion ends the lease); never when there are none. Returns the lines kept.
CREATE FUNCTION cyclone.step_logs_add(p_items jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := cyclone.now();
    v_item    jsonb;
    v_line    jsonb;
    v_run_id  uuid;
    v_node    text;
    v_attempt integer;
    v_seq     integer;
    v_bytes   bigint;
    v_text    text;
    v_kept    integer := 0;
BEGIN
    FOR v_item IN SELECT x FROM jsonb_array_elements(p_items) x LOOP
        v_run_id := (v_item->>'run_id')::uuid;
        v_node := v_item->>'node';
        SELECT s.attempt INTO v_attempt FROM cyclone.steps s
         WHERE s.run_id = v_run_id AND s.node = v_node
           AND s.lease_token = (v_item->>'lease_token')::uuid
           -- By key: see steps_leased_idx.
           AND CASE WHEN s.status = 'running' THEN s.lease_expires_at > v_now END;
        CONTINUE WHEN NOT FOUND;
        SELECT coalesce(max(l.seq), 0), coalesce(sum(octet_length(l.message)), 0)
          INTO v_seq, v_bytes
          FROM cyclone.step_logs l
         WHERE l.run_id = v_run_id AND l.node = v_node AND l.attempt = v_attempt;
        CONTINUE WHEN v_seq > 1000;  -- the cap's marker is there: the attempt is full
        FOR v_line IN SELECT x FROM jsonb_array_elements(v_item->'lines') x LOOP
            v_text := left(coalesce(v_line->>'message', ''), 4096);
            IF v_seq >= 1000 OR v_bytes + octet_length(v_text) > 262144 THEN
                INSERT INTO cyclone.step_logs (run_id, node, attempt, seq, at, level, logger,
                                               message)
                VALUES (v_run_id, v_node, v_attempt, 1001, v_now, 'WARNING', 'cyclone',
                        'log cap reached (1000 lines or 256 KiB per attempt): the rest '
                        'of this attempt''s lines were dropped');
                EXIT;
            END IF;
            v_seq := v_seq + 1;
            v_bytes := v_bytes + octet_length(v_text);
            INSERT INTO cyclone.step_logs (run_id, node, attempt, seq, at, level, logger,
                                           message)
            VALUES (v_run_id, v_node, v_attempt, v_seq,
                    coalesce((v_line->>'at')::timestamptz, v_now),
                    left(coalesce(nullif(v_line->>'level', ''), 'INFO'), 16),
                    left(coalesce(v_line->>'logger', ''), 200), v_text);
            v_kept := v_kept + 1;
        END LOOP;
    END LOOP;
    RETURN v_kept;
END;
$$;
