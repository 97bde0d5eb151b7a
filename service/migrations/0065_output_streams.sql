-- Output streams: the tables cyclone.stream_chunks and cyclone.stream_usage, and
-- cyclone.stream_emit (EmitChunks). service/schema/56_streams.sql says more.

CREATE TABLE cyclone.stream_chunks (
    run_id  uuid        NOT NULL,
    stream  text        COLLATE "C" NOT NULL,
    -- The chunk's place in its stream: 0, 1, 2... in the order chunks were stored.
    pos     bigint      NOT NULL,
    node    text        COLLATE "C" NOT NULL,
    step_id text        COLLATE "C" NOT NULL,
    seq     integer     NOT NULL,
    -- The attempt of the node that stored it.
    attempt integer     NOT NULL,
    at      timestamptz NOT NULL,
    -- The chunk: text, or JSON text when json.
    data    text        NOT NULL,
    json    boolean     NOT NULL,
    PRIMARY KEY (run_id, stream, pos),
    CONSTRAINT stream_chunks_identity UNIQUE (run_id, node, stream, step_id, seq),
    FOREIGN KEY (run_id) REFERENCES cyclone.runs ON DELETE CASCADE
);

-- What a run's streams hold, over all of them: the server's bounds
-- (--max-stream-bytes-per-run, --max-stream-chunks-per-run) are checked against it. Its
-- row is locked by each write, so that the writers of one run give out offsets one at
-- a time.
CREATE TABLE cyclone.stream_usage (
    run_id uuid   NOT NULL PRIMARY KEY,
    chunks bigint NOT NULL,
    bytes  bigint NOT NULL,
    FOREIGN KEY (run_id) REFERENCES cyclone.runs ON DELETE CASCADE
);

-- Stores chunks written by the holder of a node's lease. p_chunks is [{stream, step_id,
-- seq, data, json}], in the order they were emitted. A chunk whose identity is stored
-- already is not stored again (a replay): its row says duplicate with the offset it has.
-- The new chunks take the next offsets of their streams and count against the run's
-- bounds, p_max_bytes (bytes of data) and p_max_chunks: past either, nothing of the call
-- is stored and it fails with 54000 (program_limit_exceeded, RESOURCE_EXHAUSTED). CY001
-- when the lease is not held, CY004 for a bad stream name, step_id or seq. Notifies
-- cyclone_stream with the run id when it stored anything (ReadStream's live readers).
-- RPC: EmitChunks.
CREATE FUNCTION cyclone.stream_emit(p_run_id uuid, p_node text, p_lease_token uuid,
                                    p_chunks jsonb, p_max_bytes bigint,
                                    p_max_chunks bigint)
RETURNS TABLE (stream text, pos bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := cyclone.now();
    v_attempt integer;
    v_chunk   jsonb;
    v_stream  text;
    v_step_id text;
    v_seq     integer;
    v_data    text;
    v_pos     bigint;
    v_chunks  bigint;
    v_bytes   bigint;
    v_added   bigint := 0;
    v_size    bigint := 0;
BEGIN
    v_attempt := cyclone._step_held(p_run_id, p_node, p_lease_token, true);
    INSERT INTO cyclone.stream_usage AS u (run_id, chunks, bytes) VALUES (p_run_id, 0, 0)
        ON CONFLICT (run_id) DO NOTHING;
    SELECT u.chunks, u.bytes INTO v_chunks, v_bytes
      FROM cyclone.stream_usage u WHERE u.run_id = p_run_id FOR UPDATE;
    FOR v_chunk IN SELECT x FROM jsonb_array_elements(p_chunks) x LOOP
        v_stream := v_chunk->>'stream';
        v_step_id := coalesce(v_chunk->>'step_id', '');
        v_seq := (v_chunk->>'seq')::integer;
        v_data := coalesce(v_chunk->>'data', '');
        IF v_stream IS NULL OR length(v_stream) NOT BETWEEN 1 AND 200
           OR v_stream ~ '[[:cntrl:]]' THEN
            RAISE EXCEPTION 'a stream name must be 1 to 200 printable characters'
                USING ERRCODE = 'CY004';
        END IF;
        IF length(v_step_id) > 200 OR v_seq IS NULL OR v_seq < 1 THEN
            RAISE EXCEPTION 'a chunk needs a step_id of at most 200 characters and a seq of 1 or more'
                USING ERRCODE = 'CY004';
        END IF;
        SELECT c.pos INTO v_pos FROM cyclone.stream_chunks c
         WHERE c.run_id = p_run_id AND c.node = p_node AND c.stream = v_stream
           AND c.step_id = v_step_id AND c.seq = v_seq;
        IF FOUND THEN
            RETURN QUERY SELECT v_stream, v_pos, true;
            CONTINUE;
        END IF;
        IF v_chunks + v_added + 1 > p_max_chunks
           OR v_bytes + v_size + octet_length(v_data) > p_max_bytes THEN
            RAISE EXCEPTION 'the streams of run % are full: at most % chunks and % bytes '
                            'per run', p_run_id, p_max_chunks, p_max_bytes
                USING ERRCODE = '54000';
        END IF;
        SELECT coalesce(max(c.pos) + 1, 0) INTO v_pos FROM cyclone.stream_chunks c
         WHERE c.run_id = p_run_id AND c.stream = v_stream;
        INSERT INTO cyclone.stream_chunks (run_id, stream, pos, node, step_id, seq, attempt,
                                           at, data, json)
        VALUES (p_run_id, v_stream, v_pos, p_node, v_step_id, v_seq, v_attempt, v_now,
                v_data, coalesce((v_chunk->>'json')::boolean, false));
        v_added := v_added + 1;
        v_size := v_size + octet_length(v_data);
        RETURN QUERY SELECT v_stream, v_pos, false;
    END LOOP;
    IF v_added > 0 THEN
        UPDATE cyclone.stream_usage u
           SET chunks = u.chunks + v_added, bytes = u.bytes + v_size
         WHERE u.run_id = p_run_id;
        PERFORM pg_notify('cyclone_stream', p_run_id::text);
    END IF;
END;
$$;
