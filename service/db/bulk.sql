-- Named queries of the server's db wing: bulk actions (service/db/bulk.py).
-- Each block starts with "-- name: <name>"; parameters are bound (:name), never formatted in.

-- name: bulk_start
SELECT j.*, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.bulk_start(CAST(:job_id AS uuid), :action, CAST(:filter AS jsonb),
                          CAST(:query AS jsonb), :reason, :actor, :total,
                          :total_at_least) j;

-- name: bulk_claim
SELECT j.*, NULL::text AS ready FROM cyclone.bulk_claim(:owner, :lease_s) j;

-- name: bulk_apply
-- With the actions the batch's transitions made claimable.
SELECT j.*, current_setting('cyclone.ready', true) AS ready
  FROM cyclone.bulk_apply(CAST(:job_id AS uuid), :owner, :lease_s,
                          CAST(:after_at AS timestamptz), CAST(:after_run AS uuid),
                          CAST(:runs AS uuid[]), CAST(:cursor_at AS timestamptz),
                          CAST(:cursor_run AS uuid), :done) j;

-- name: bulk_cancel
SELECT j.*, NULL::text AS ready FROM cyclone.bulk_cancel(CAST(:job_id AS uuid), :actor) j;

-- name: bulk_get
SELECT j.*, NULL::text AS ready FROM cyclone.bulk_actions j
 WHERE j.job_id = CAST(:job_id AS uuid);

-- name: bulk_list
-- Newest first, keyset-paged on (created_at, job_id).
SELECT j.*, NULL::text AS ready FROM cyclone.bulk_actions j
 WHERE CAST(:after_created AS timestamptz) IS NULL
    OR (j.created_at, j.job_id) < (CAST(:after_created AS timestamptz),
                                   CAST(:after_job_id AS uuid))
 ORDER BY j.created_at DESC, j.job_id DESC
 LIMIT :limit;
