-- ListRuns and CountRuns find runs by a prefix of their SubmitOnce key. LIKE 'prefix%'
-- is a range of a btree index only when the index compares byte by byte: the key index
-- is rebuilt with text_pattern_ops, which serves an exact key as before. The index
-- holds the keyed runs only; the rebuild locks runs against writes while it reads them.
DROP INDEX cyclone.runs_key_idx;
CREATE INDEX runs_key_idx ON cyclone.runs (submit_key text_pattern_ops, workflow)
    WHERE submit_key IS NOT NULL;

-- ListWorkers lists idle workers too. The workers the servers saw ask for work (a Claim, or a claim of a Work stream): the
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
