-- Signed webhooks: HTTP ingress for events and submits (POST /webhooks/<name> on the
-- server's HTTP listener, docs/webhooks.md). An operator defines each endpoint
-- (CreateWebhook); the server checks a delivery's HMAC signature and timestamp, then
-- webhook_deliver records its delivery id and acts (SendEvent or SubmitOnce) in one
-- transaction.

-- The webhook endpoints, by name. Not a run's table.
CREATE TABLE cyclone.webhooks (
    name            text        PRIMARY KEY,
    -- The HMAC-SHA256 key of its signatures. Kept as given: the server needs it to
    -- check each signature.
    secret          text        NOT NULL CHECK (length(secret) >= 16),
    -- send_event: the event `event` to the run whose id is at run_id_pointer in the
    -- payload; submit_once: a run of `workflow` (a workflow file's JSON) with the
    -- payload as input, at most one per key (at key_pointer in the payload).
    action          text        NOT NULL CHECK (action IN ('send_event', 'submit_once')),
    run_id_pointer  text,
    event           text,
    workflow        jsonb,
    key_pointer     text,
    created_by      text        NOT NULL,
    created_at      timestamptz NOT NULL,
    CONSTRAINT webhooks_action_fields CHECK (
        CASE action
            WHEN 'send_event' THEN run_id_pointer IS NOT NULL AND event IS NOT NULL
                                   AND workflow IS NULL AND key_pointer IS NULL
            ELSE workflow IS NOT NULL AND key_pointer IS NOT NULL
                 AND run_id_pointer IS NULL AND event IS NULL
        END)
);

-- The deliveries accepted recently, by webhook and delivery id: a delivery seen again
-- is refused. Kept for twice the timestamp tolerance (a delivery older than that is
-- refused by its timestamp), deleted with their webhook.
CREATE TABLE cyclone.webhook_deliveries (
    webhook     text        NOT NULL REFERENCES cyclone.webhooks ON DELETE CASCADE,
    delivery_id text        NOT NULL,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (webhook, delivery_id)
);
CREATE INDEX webhook_deliveries_received_idx
    ON cyclone.webhook_deliveries (webhook, received_at);

-- One delivery of webhook p_name whose signature the server checked, in one
-- transaction: the deliveries older than p_keep are forgotten; p_delivery_id is
-- recorded, or, when it was seen already, nothing is done (outcome replayed); then the
-- webhook's action: event_send(p_run_id, its event, p_payload) (outcome event_sent,
-- with event_id), or cyclone.submit(its workflow, p_payload, key p_key) (outcome
-- submitted, with run_id and created). Outcome unknown for no such webhook. The
-- action's errors (an unknown or finished run, an invalid input or key) roll the whole
-- delivery back, its id too.
CREATE FUNCTION cyclone.webhook_deliver(p_name text, p_delivery_id text, p_payload jsonb,
                                        p_run_id uuid, p_key text, p_keep interval)
RETURNS TABLE (outcome text, run_id uuid, created boolean, event_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := cyclone.now();
    v_hook cyclone.webhooks;
    v_run  uuid;
    v_new  boolean;
    v_id   bigint;
BEGIN
    SELECT * INTO v_hook FROM cyclone.webhooks w WHERE w.name = p_name;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown', NULL::uuid, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    DELETE FROM cyclone.webhook_deliveries d
     WHERE d.webhook = p_name AND d.received_at < v_now - p_keep;
    INSERT INTO cyclone.webhook_deliveries AS d (webhook, delivery_id, received_at)
    VALUES (p_name, p_delivery_id, v_now)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'replayed', NULL::uuid, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    IF v_hook.action = 'send_event' THEN
        SELECT e.event_id INTO v_id
          FROM cyclone.event_send(p_run_id, v_hook.event, p_payload, NULL,
                                  'webhook:' || p_name) e;
        RETURN QUERY SELECT 'event_sent', p_run_id, true, v_id;
    ELSE
        SELECT s.run_id, s.created INTO v_run, v_new
          FROM cyclone.submit(workflow => v_hook.workflow, input => p_payload,
                              key => p_key) s;
        RETURN QUERY SELECT 'submitted', v_run, v_new, NULL::bigint;
    END IF;
END;
$$;
