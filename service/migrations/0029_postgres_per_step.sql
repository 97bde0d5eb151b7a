-- Postgres's cost per step: fillfactor 60 on runs and steps, and the run's close in
-- PL/pgSQL (docs/performance.md, "The engine's SQL").
--
-- Room on each page of runs and steps for the new versions of their rows, so that a
-- transition's update stays on its row's page (no lock record for the old version,
-- only the changed bytes logged, no other page touched). Pages written from now on
-- keep it; existing ones fill as before.
ALTER TABLE cyclone.runs SET (fillfactor = 60);
ALTER TABLE cyclone.steps SET (fillfactor = 60);

-- _runs_close in PL/pgSQL (its plan kept for the session) with one lookup of a closing
-- run's first discarded step instead of two.
-- Closes runs by counts: each run's steps_open goes down by the number of its steps
-- that became final; a running run left with none open is completed, or failed with
-- a StepDiscarded error naming its first discarded step. A child run that finishes so
-- wakes its parent's node when it waits for it (_child_finished, called for those
-- runs only). Returns each run's status. Runs are found by primary key, and a closing
-- run's discarded step is looked up once, by key, through steps_discarded_idx, so no
-- plan scans steps. PL/pgSQL so that the statement's plan is kept for the session
-- (before PostgreSQL 18 a SQL function's was made again at every call: a fifth of
-- this function's time in a drain on PostgreSQL 15). Called by _run_close and by
-- step_complete_many (runs whose completed steps have no dependents).
CREATE OR REPLACE FUNCTION cyclone._runs_close(p_runs uuid[], p_closed integer[],
                                               p_now timestamptz)
RETURNS TABLE (run_id uuid, status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH closed AS (
        UPDATE cyclone.runs r
           SET steps_open = r.steps_open - c.closed,
               updated_at = p_now,
               -- One sub-select for the three: the first discarded step is looked up
               -- once, and only for a run that closes here (the lateral's condition
               -- on the outer row is checked before any lookup).
               (status, finished_at, error) = (
                   SELECT CASE WHEN x.run_id IS NULL THEN r.status
                               WHEN x.node IS NULL THEN 'completed'
                               ELSE 'failed' END,
                          CASE WHEN x.run_id IS NULL THEN r.finished_at ELSE p_now END,
                          CASE WHEN x.node IS NULL THEN r.error
                               ELSE jsonb_build_object(
                                        'kind', 'StepDiscarded',
                                        'message', format('node %s was discarded at attempt %s',
                                                          x.node, x.attempt),
                                        'node', x.node, 'attempt', x.attempt,
                                        'started_at', x.started_at) END
                     FROM (SELECT) AS one
                     LEFT JOIN LATERAL (
                          SELECT r.run_id, d.node, d.attempt, d.started_at
                            FROM (SELECT) AS closing
                            LEFT JOIN LATERAL (
                                 SELECT s.node, s.attempt, s.started_at FROM cyclone.steps s
                                  WHERE s.run_id = r.run_id AND s.status = 'discarded'
                                  ORDER BY s.finished_at, s.node LIMIT 1) d ON true
                           WHERE r.steps_open <= c.closed AND r.status = 'running') x
                       ON true)
          FROM unnest(p_runs, p_closed) AS c(run_id, closed)
         WHERE r.run_id = c.run_id AND r.run_id = ANY (p_runs)
        RETURNING r.run_id, r.status, r.parent_run_id, r.finished_at)
    -- CASE evaluates its branch only when taken: runs without a parent, and runs
    -- that did not finish here, cost nothing more.
    SELECT c.run_id,
           CASE WHEN c.parent_run_id IS NOT NULL AND c.finished_at = p_now
                THEN cyclone._child_finished(c.run_id, c.parent_run_id, c.status)
                ELSE c.status END
      FROM closed c;
END;
$$;
