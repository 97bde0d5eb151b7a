-- Retention: the server deletes finished runs past a configurable age, a small batch
-- at a time (cyclone-server --retention, --retention-failed). Deleting a run deletes
-- its steps, their errors and journals, and its audit trail through the foreign keys'
-- cascades.
-- Each batch takes its rows with FOR UPDATE SKIP LOCKED: a row another transaction
-- holds is left for the next batch, and nothing waits on the purge.

-- Deletes up to p_limit runs that finished more than p_age ago, oldest first:
-- completed and cancelled runs when p_failed is false, failed runs when it is true.
-- Blocked and running runs are never deleted. The locked runs are deleted by their
-- ctids (re-checking the status). Returns how many runs it deleted. Called by each
-- server's retention loop.
CREATE FUNCTION cyclone.runs_purge(p_age interval, p_failed boolean, p_limit integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_before timestamptz := cyclone.now() - p_age;
    v_count  integer;
BEGIN
    IF p_failed THEN
        DELETE FROM cyclone.runs r
         WHERE r.ctid = ANY (ARRAY(
               SELECT o.ctid FROM cyclone.runs o
                WHERE o.status = 'failed' AND o.finished_at < v_before
                ORDER BY o.finished_at
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED))
           AND r.status = 'failed';
    ELSE
        DELETE FROM cyclone.runs r
         WHERE r.ctid = ANY (ARRAY(
               SELECT o.ctid FROM cyclone.runs o
                WHERE o.status IN ('completed', 'cancelled') AND o.finished_at < v_before
                ORDER BY o.finished_at
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED))
           AND r.status IN ('completed', 'cancelled');
    END IF;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

-- Deletes up to p_limit SubmitOnce keys older than p_age whose run is gone. Returns
-- how many. Called by each server's retention loop.
CREATE FUNCTION cyclone.submit_keys_purge(p_age interval, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    DELETE FROM cyclone.submit_keys k
     WHERE k.key_id IN (
           SELECT o.key_id FROM cyclone.submit_keys o
            WHERE o.created_at < cyclone.now() - p_age
              AND NOT EXISTS (SELECT 1 FROM cyclone.runs r WHERE r.run_id = o.run_id)
            ORDER BY o.created_at
            LIMIT p_limit
              FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
