-- A waiting claim sets its timer by step_next_due, called after a claim that took
-- nothing. A step that came due between that claim and the call was counted as due
-- already, and so as held back by a key or a rate: the claim then slept until the next
-- notification or --claim-recheck, with a step ready for it. Both functions now take
-- p_since, the seconds since the claim, and count a step that came due after it as
-- due now (negative seconds): the caller claims again at once.
DROP FUNCTION cyclone.step_next_due(text[]);
DROP FUNCTION cyclone.step_next_due_sharded(text[]);

-- Seconds until a claim of these actions may find work (negative: now; NULL: none
-- known). For each action, each priority present among its ready rows is visited
-- once, through steps_ready_idx (a loose index scan), and gives the earliest
-- available_at of that priority later than the last claim (p_since seconds ago, which
-- the caller measures from before it claimed): a row that came due between that claim
-- and this call is due now, and the caller claims again at once rather than sleeping
-- past it. A ready row that was due already when the claim took nothing is held back
-- by its concurrency key or its action's rate limit (or was locked by another claim):
-- the rate's row says when its window opens (reopens_at); a key has no such time, but
-- a step that frees a slot of a full key (completed, failed, waiting, reclaimed by the
-- sweep) wakes the claims of its action (_notify_ready, _key_wake), so the claim waits for that
-- (or for the server's --claim-recheck, for a slot freed otherwise: a cancel, or a
-- key that steps of several actions share). Called by a waiting Claim (the named
-- query step_next_due) each time it finds nothing.
CREATE FUNCTION cyclone.step_next_due(p_actions text[], p_since float8 DEFAULT 0)
RETURNS float8
-- PL/pgSQL keeps a generic plan of the statement (the same index probes for every
-- argument); planning it took four times as long as running it.
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (
    WITH RECURSIVE clock(now, claimed) AS (
        SELECT n, n - make_interval(secs => greatest(p_since, 0))
          FROM cyclone.now() AS n),
    levels(action, priority) AS (
        SELECT a.action, (SELECT s.priority FROM cyclone.steps s
                           WHERE s.status = 'available' AND s.action = a.action
                           ORDER BY s.priority DESC LIMIT 1)
          FROM (SELECT DISTINCT x FROM unnest(p_actions) x) AS a(action)
        UNION ALL
        SELECT l.action, (SELECT s.priority FROM cyclone.steps s
                           WHERE s.status = 'available' AND s.action = l.action
                             AND s.priority < l.priority
                           ORDER BY s.priority DESC LIMIT 1)
          FROM levels l
         WHERE l.priority IS NOT NULL
    )
    SELECT extract(epoch FROM min(d.due) - min(c.now))::float8
      FROM clock c
     CROSS JOIN levels l
     CROSS JOIN LATERAL (
           SELECT (SELECT s.available_at FROM cyclone.steps s
                    WHERE s.status = 'available' AND s.action = l.action
                      AND s.priority = l.priority
                    ORDER BY s.available_at LIMIT 1) AS first_at,
                  (SELECT s.available_at FROM cyclone.steps s
                    WHERE s.status = 'available' AND s.action = l.action
                      AND s.priority = l.priority AND s.available_at > c.claimed
                    ORDER BY s.available_at LIMIT 1) AS next_at) f
     CROSS JOIN LATERAL (
           SELECT least(f.next_at,
                        CASE WHEN f.first_at <= c.now THEN
                            (SELECT t.reopens_at FROM cyclone.action_rates t
                              WHERE t.action = l.action AND t.reopens_at > c.now) END)
                  AS due) d
     WHERE l.priority IS NOT NULL);
END;
$$;

-- step_next_due on a sharded database: seconds until a claim of these actions may find
-- work, read across shards; NULL when none waits: the soonest ready step coming due
-- since the last claim, p_since seconds ago (a backoff, a start time; negative when it
-- came due after that claim), or, when a step is due already but the claim took nothing,
-- the time a rate-limited action's window opens again (reopens_at). A key has no such
-- time: the step that frees its slot wakes the claims of its action (as on one
-- Postgres, step_next_due). Asked by a waiting Claim to set its timer.
CREATE FUNCTION cyclone.step_next_due_sharded(p_actions text[], p_since float8 DEFAULT 0)
RETURNS float8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now   timestamptz := cyclone.now();
    v_claim timestamptz := v_now - make_interval(secs => greatest(p_since, 0));
    v_next  timestamptz;
    v_due   text[];
    v_opens timestamptz;
BEGIN
    v_next := (SELECT min(s.available_at) FROM cyclone.steps s
                WHERE s.status = 'available' AND s.action = ANY (p_actions)
                  AND s.available_at > v_claim);
    IF EXISTS (SELECT 1 FROM cyclone.action_rates t
                WHERE t.action = ANY (p_actions) AND t.reopens_at > v_now) THEN
        v_due := ARRAY(SELECT DISTINCT s.action FROM cyclone.steps s
                        WHERE s.status = 'available' AND s.action = ANY (p_actions)
                          AND s.available_at <= v_now);
        v_opens := (SELECT min(t.reopens_at) FROM cyclone.action_rates t
                     WHERE t.action = ANY (v_due) AND t.reopens_at > v_now);
    END IF;
    RETURN extract(epoch FROM least(v_next, v_opens) - v_now)::float8;
END;
$$;
