-- Retention: the server deletes finished runs past a configurable age, a small batch at
-- a time (cyclone-server --retention, --retention-failed). Deleting a run deletes its
-- steps, their errors and its audit trail through the foreign keys' cascades.
--
-- Each batch takes its runs with FOR UPDATE SKIP LOCKED: a run another transaction
-- holds (a late completion, another server's batch) is left for the next batch, and
-- nothing waits on the purge. Claims never meet the rows it deletes: a finished run
-- has no ready step.
--
-- The two partial indexes hold exactly the runs each policy may delete, oldest first,
-- so a batch reads its rows off the front of an index however many runs are kept.
-- Finishing a run already changes its indexed status, so they add one index entry per
-- finished run and nothing per step.

CREATE INDEX runs_finished_idx ON cyclone.runs (finished_at)
    WHERE status IN ('completed', 'cancelled');
CREATE INDEX runs_failed_idx ON cyclone.runs (finished_at) WHERE status = 'failed';

-- Deletes up to p_limit runs that finished more than p_age ago: completed and cancelled
-- runs when p_failed is false, failed runs when it is true. Blocked and running runs
-- are never deleted. Returns how many runs it deleted.
CREATE FUNCTION cyclone.runs_purge(p_age interval, p_failed boolean, p_limit integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_before timestamptz := cyclone.now() - p_age;
    v_count  integer;
BEGIN
    IF p_failed THEN
        DELETE FROM cyclone.runs r
         WHERE r.run_id IN (
               SELECT o.run_id FROM cyclone.runs o
                WHERE o.status = 'failed' AND o.finished_at < v_before
                ORDER BY o.finished_at
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED)
           AND r.status = 'failed';
    ELSE
        DELETE FROM cyclone.runs r
         WHERE r.run_id IN (
               SELECT o.run_id FROM cyclone.runs o
                WHERE o.status IN ('completed', 'cancelled') AND o.finished_at < v_before
                ORDER BY o.finished_at
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED)
           AND r.status IN ('completed', 'cancelled');
    END IF;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
