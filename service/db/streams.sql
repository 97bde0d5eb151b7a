-- Named queries of the server's db wing: output streams (service/db/streams.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: stream_emit
-- EmitChunks: stores the chunks of a held node (cyclone.stream_emit,
-- service/schema/56_streams.sql); one row per chunk, in order.
SELECT e.stream, e.pos, e.duplicate
  FROM cyclone.stream_emit(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid),
                           CAST(:chunks AS jsonb), :max_bytes, :max_chunks) e;

-- name: stream_read
-- ReadStream: up to :limit chunks of a stream from offset :from_pos, with the run's
-- status read in the same snapshot (one row with NULL chunk columns when there is no
-- chunk to read; no row when the run does not exist). A run that is finished in this
-- snapshot stores no more chunks: a reader that got fewer than :limit is done.
SELECT r.status, c.pos, c.node, c.step_id, c.attempt, c.at, c.data, c.json
  FROM cyclone.runs r
  LEFT JOIN LATERAL (
       SELECT c.pos, c.node, c.step_id, c.attempt, c.at, c.data, c.json
         FROM cyclone.stream_chunks c
        WHERE c.run_id = r.run_id AND c.stream = :stream AND c.pos >= :from_pos
        ORDER BY c.pos
        LIMIT :limit) c ON true
 WHERE r.run_id = CAST(:run_id AS uuid)
 ORDER BY c.pos;

-- name: streams_list
-- ListStreams: the streams of a run with their chunk counts and bytes, by name (one row
-- with NULL columns when it has none; no row when the run does not exist).
SELECT s.stream, s.chunks, s.bytes, s.last_at
  FROM cyclone.runs r
  LEFT JOIN LATERAL (
       SELECT c.stream, count(*) AS chunks, sum(octet_length(c.data)) AS bytes,
              max(c.at) AS last_at
         FROM cyclone.stream_chunks c
        WHERE c.run_id = r.run_id
        GROUP BY c.stream) s ON true
 WHERE r.run_id = CAST(:run_id AS uuid)
 ORDER BY s.stream;

-- name: runs_open
-- The runs among :run_ids that exist and are not finished (the live readers' runs,
-- looked at by one statement per server: service/engine/streams.py).
SELECT r.run_id::text AS run_id
  FROM cyclone.runs r
 WHERE r.run_id = ANY (CAST(:run_ids AS uuid[])) AND r.finished_at IS NULL;
