-- ListRuns and CountRuns find runs by a prefix of their SubmitOnce key. LIKE 'prefix%'
-- is a range of a btree index only when the index compares byte by byte: the key index
-- is rebuilt with text_pattern_ops, which serves an exact key as before. The index
-- holds the keyed runs only; the rebuild locks runs against writes while it reads them.
DROP INDEX cyclone.runs_key_idx;
CREATE INDEX runs_key_idx ON cyclone.runs (submit_key text_pattern_ops, workflow)
    WHERE submit_key IS NOT NULL;
