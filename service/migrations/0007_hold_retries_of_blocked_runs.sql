-- A blocked run hands nothing out until it is resolved. When it blocks, its ready steps
-- are held (pending); but a step already running then could still fail afterwards,
-- and step_fail (0002) made a retryable failure available again after its backoff.
-- Claims do not look at the run's status, so a worker would have run that step in the
-- blocked run. Now such a step is held like the others: pending, released by Resolve
-- together with them (at once: the backoff is not kept across the block).
ALTER FUNCTION cyclone.step_fail(uuid, text, uuid, text, text, text, boolean, interval)
    RENAME TO _step_fail_unheld;

CREATE FUNCTION cyclone.step_fail(
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
    RETURN v_done;
END;
$$;
