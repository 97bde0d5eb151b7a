-- Several completions in one transaction (WorkerService.CompleteMany). Each item is
-- applied by step_complete or step_fail inside its own subtransaction, so a refused
-- item (lease lost, unknown step) rolls back alone and is reported with its SQLSTATE.
-- Items are taken in (run_id, node) order: every batch then locks run rows in the same
-- order, so two batches cannot deadlock.
--
-- p_items: JSON array of {i, run_id, node, lease_token, output} (success) or
-- {i, run_id, node, lease_token, failure: {type, message, details, retryable,
-- retry_after_s}}; i is the item's index in the request, returned with its result.
CREATE FUNCTION cyclone.step_complete_many(p_items jsonb)
RETURNS TABLE (i integer, step_status text, run_status text, duplicate boolean,
               retry_at timestamptz, error_state text, error_message text,
               error_detail text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_item jsonb;
    v_done cyclone.completion;
BEGIN
    FOR v_item IN
        SELECT e FROM jsonb_array_elements(p_items) e
         ORDER BY e->>'run_id', e->>'node', (e->>'i')::integer
    LOOP
        i := (v_item->>'i')::integer;
        BEGIN
            IF v_item ? 'failure' THEN
                v_done := cyclone.step_fail(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'failure'->>'type', v_item->'failure'->>'message',
                    v_item->'failure'->>'details', (v_item->'failure'->>'retryable')::boolean,
                    make_interval(secs => (v_item->'failure'->>'retry_after_s')::float8));
            ELSE
                v_done := cyclone.step_complete(
                    (v_item->>'run_id')::uuid, v_item->>'node', (v_item->>'lease_token')::uuid,
                    v_item->'output');
            END IF;
            step_status := v_done.step_status;
            run_status := v_done.run_status;
            duplicate := v_done.duplicate;
            retry_at := v_done.retry_at;
            error_state := NULL;
            error_message := NULL;
            error_detail := NULL;
        EXCEPTION WHEN SQLSTATE 'CY001' OR SQLSTATE 'CY002' OR SQLSTATE 'CY003' THEN
            GET STACKED DIAGNOSTICS error_state = RETURNED_SQLSTATE,
                                    error_message = MESSAGE_TEXT,
                                    error_detail = PG_EXCEPTION_DETAIL;
            step_status := NULL;
            run_status := NULL;
            duplicate := NULL;
            retry_at := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;
