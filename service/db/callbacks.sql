-- Named queries of the server's db wing: approvals and webhooks (service/db/callbacks.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: approval_create
-- CreateApproval: the approval of an approval call, fenced by the node's lease.
SELECT a.approval_id, a.expires_at, a.decided
  FROM cyclone.approval_create(CAST(:run_id AS uuid), :node, CAST(:lease_token AS uuid),
                               :step_id, CAST(:approval_id AS uuid), :token_sha256,
                               make_interval(secs => :ttl_s), :title) a;

-- name: approval_decide
-- POST /callbacks/<token> (by the token's hash) or DecideApproval (by id): once.
SELECT d.outcome, d.approval_id, d.run_id, d.decided_at, d.decided_by,
       current_setting('cyclone.ready', true) AS ready
  FROM cyclone.approval_decide(:token_sha256, CAST(:approval_id AS uuid),
                               CAST(:payload AS jsonb), :actor) d;

-- name: approvals_list
-- ListApprovals: newest first; the pending ones unless :all.
SELECT a.approval_id, a.run_id, a.node, a.step_id, a.title, a.created_at, a.expires_at,
       a.decided_at, a.decided_by, a.decision, r.workflow
  FROM cyclone.approvals a JOIN cyclone.runs r ON r.run_id = a.run_id
 WHERE (CAST(:run_id AS uuid) IS NULL OR a.run_id = CAST(:run_id AS uuid))
   AND (:all OR (a.decided_at IS NULL AND a.expires_at > cyclone.now()
                 AND r.status IN ('running', 'blocked')))
 ORDER BY a.created_at DESC, a.approval_id
 LIMIT :limit;

-- name: approval_get
-- One approval, by id.
SELECT a.approval_id, a.run_id, a.node, a.step_id, a.title, a.created_at, a.expires_at,
       a.decided_at, a.decided_by, a.decision, r.workflow
  FROM cyclone.approvals a JOIN cyclone.runs r ON r.run_id = a.run_id
 WHERE a.approval_id = CAST(:approval_id AS uuid);

-- name: webhook_create
-- CreateWebhook: no row when the name is taken.
INSERT INTO cyclone.webhooks AS w (name, secret, action, run_id_pointer, event, workflow,
                                   key_pointer, created_by, created_at)
VALUES (:hook, :secret, :action, :run_id_pointer, :event, CAST(:workflow AS jsonb),
        :key_pointer, :actor, cyclone.now())
    ON CONFLICT (name) DO NOTHING
RETURNING w.name, w.secret, w.action, w.run_id_pointer, w.event, w.workflow, w.key_pointer,
          w.created_by, w.created_at;

-- name: webhooks_list
SELECT w.name, w.secret, w.action, w.run_id_pointer, w.event, w.workflow, w.key_pointer,
       w.created_by, w.created_at
  FROM cyclone.webhooks w ORDER BY w.name;

-- name: webhook_get
SELECT w.name, w.secret, w.action, w.run_id_pointer, w.event, w.workflow, w.key_pointer,
       w.created_by, w.created_at
  FROM cyclone.webhooks w WHERE w.name = :hook;

-- name: webhook_delete
DELETE FROM cyclone.webhooks w WHERE w.name = :hook
RETURNING w.name, w.secret, w.action, w.run_id_pointer, w.event, w.workflow, w.key_pointer,
          w.created_by, w.created_at;

-- name: webhook_deliver
-- POST /webhooks/<name> once its signature is checked: delivery id and action, one
-- transaction.
SELECT d.outcome, d.run_id, d.created, d.event_id, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.webhook_deliver(:hook, :delivery_id, CAST(:payload AS jsonb),
                               CAST(:run_id AS uuid), :key,
                               make_interval(secs => :keep_s)) d;

-- name: approval_by_token
-- GET /callbacks/<token>: the approval a token names, to show its form (reads only).
SELECT a.run_id, a.node, a.title, a.expires_at, a.decided_at, r.workflow,
       a.expires_at <= cyclone.now() AS expired
  FROM cyclone.approvals a JOIN cyclone.runs r ON r.run_id = a.run_id
 WHERE a.token_sha256 = :token_sha256;
