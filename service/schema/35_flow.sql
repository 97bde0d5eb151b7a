-- Flow control: the state and helpers behind the claim's rate limits and concurrency
-- keys (step_claim, 30_claim.sql), and when a waiting claim looks again
-- (step_next_due). Priorities and start times need no helper: they are columns of
-- steps and runs, read by the claim's walk of steps_ready_idx. docs/flow-control.md.

-- The recent claims of each rate-limited action, in buckets: bucket i holds counts[i]
-- claims made between firsts[i] and lasts[i]. A bucket counts against the limit while
-- its last claim is inside the window (lasts[i] > now - period), so the count is never
-- less than the claims in the window. A bucket spans at most a sixteenth of the
-- period, so at most that share of the limit is lost to the rounding. Keyed by action
-- (not by run): one row per action that a worker declared a rate limit for; step_claim
-- locks it (_rate_room) and updates it (_rate_next) in the claim's transaction.
CREATE TABLE cyclone.action_rates (
    action     text          PRIMARY KEY,
    firsts     timestamptz[] NOT NULL DEFAULT '{}',
    lasts      timestamptz[] NOT NULL DEFAULT '{}',
    counts     integer[]     NOT NULL DEFAULT '{}',
    -- When the window had no room left after the last claim: when room opens again
    -- (step_next_due); NULL while there is room.
    reopens_at timestamptz,
    updated_at timestamptz   NOT NULL,
    CONSTRAINT action_rates_buckets_aligned CHECK (
        cardinality(firsts) = cardinality(lasts) AND cardinality(lasts) = cardinality(counts))
);

-- Locks p_action's row of action_rates (made on first use) until the claim's commit and
-- returns how many more claims its window of p_period allows (0 or more): p_count less
-- the claims of every bucket whose last claim is later than p_now - p_period (later
-- than p_now too: a claim that waited for the lock counts those before it). VOLATILE,
-- so its count reads the row as the lock holder before it left it. Called by
-- step_claim, once per rate-limited action, in action order.
CREATE FUNCTION cyclone._rate_room(p_action text, p_count integer, p_period interval,
                                   p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_rate record;
BEGIN
    INSERT INTO cyclone.action_rates (action, updated_at) VALUES (p_action, p_now)
    ON CONFLICT (action) DO NOTHING;
    SELECT t.lasts, t.counts INTO v_rate
      FROM cyclone.action_rates t WHERE t.action = p_action FOR UPDATE;
    RETURN greatest(p_count - (SELECT coalesce(sum(b.n), 0)
                                 FROM unnest(v_rate.lasts, v_rate.counts) AS b(last, n)
                                WHERE b.last > p_now - p_period), 0);
END;
$$;

-- The buckets of an action_rates row after p_n claims at p_now: buckets out of the
-- window dropped, the claims added to the newest bucket while it spans less than a
-- sixteenth of the period (else to a new one), and when the window is full, the time
-- it opens again (when enough of its oldest buckets have left it). Called by
-- step_claim's update of action_rates.
CREATE FUNCTION cyclone._rate_next(
    p_firsts timestamptz[], p_lasts timestamptz[], p_counts integer[], p_count integer,
    p_period interval, p_now timestamptz, p_n integer,
    OUT firsts timestamptz[], OUT lasts timestamptz[], OUT counts integer[],
    OUT reopens_at timestamptz)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_k    integer;
    v_used bigint;
BEGIN
    SELECT coalesce(array_agg(b.first ORDER BY b.i), '{}'),
           coalesce(array_agg(b.last ORDER BY b.i), '{}'),
           coalesce(array_agg(b.n ORDER BY b.i), '{}')
      INTO firsts, lasts, counts
      FROM unnest(p_firsts, p_lasts, p_counts) WITH ORDINALITY AS b(first, last, n, i)
     WHERE b.last > p_now - p_period;
    v_k := cardinality(firsts);
    IF p_n > 0 THEN
        IF v_k > 0 AND p_now >= firsts[v_k] AND p_now < firsts[v_k] + p_period / 16 THEN
            lasts[v_k] := greatest(lasts[v_k], p_now);
            counts[v_k] := counts[v_k] + p_n;
        ELSE
            firsts := firsts || p_now;
            lasts := lasts || p_now;
            counts := counts || p_n;
        END IF;
    END IF;
    -- Full: room opens when the oldest buckets holding (used - count + 1) claims left.
    SELECT min(b.last) + p_period INTO reopens_at
      FROM (SELECT u.last, sum(u.n) OVER (ORDER BY u.last, u.i) AS gone,
                   sum(u.n) OVER () AS used
              FROM unnest(lasts, counts) WITH ORDINALITY AS u(last, n, i)) b
     WHERE b.used >= p_count AND b.gone > b.used - p_count;
END;
$$;

-- Takes the locks of the concurrency keys p_keys until the claim's commit, in lock
-- order (so two claims never wait on each other), then returns how many more steps
-- of each key may start: its limit (p_limits, aligned) less its running steps, 0 or
-- more. Claims of one key so take turns, and each counts the running steps as the
-- previous one left them: VOLATILE, so the count is a new statement that reads the
-- rows committed when the locks were granted, through steps_key_running_idx, at most
-- the limit of them per key. A key's lock is the two-key advisory lock (1667,
-- hashtext(key)): keys whose hashes collide only share turns. Called by step_claim,
-- once per claim that picked keyed steps.
CREATE FUNCTION cyclone._keys_room(p_keys text[], p_limits integer[])
RETURNS TABLE (concurrency_key text, room integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1667, l.h)
       FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(p_keys) k ORDER BY 1) l;
    RETURN QUERY
    SELECT k.key, greatest(k.lim - (SELECT count(*) FROM (
               SELECT 1 FROM cyclone.steps s
                WHERE s.concurrency_key = k.key AND s.status = 'running'
                LIMIT k.lim) n), 0)::integer
      FROM unnest(p_keys, p_limits) AS k(key, lim);
END;
$$;

-- The action to wake when p_freed steps of action p_action with concurrency key p_key
-- (limit p_limit) have just left `running`: p_action when the key was full before
-- they left, so that a claim may have passed over the key and be waiting for a slot;
-- NULL when the key had room (no claim was kept from it). Called after the transition
-- that freed them (so their rows are no longer among the running ones): counts the
-- key's running steps, at most p_limit of them, through steps_key_running_idx. A
-- wake-up makes every waiting claim of the action, on every server, claim again;
-- completions of keyed steps send one only when a claim may need it. A claim that
-- filled the key after this count is not seen; a claim that then waits for the slot
-- looks again at the server's --claim-recheck. Called by the completion and failure
-- transitions (_step_complete, step_complete_many, _step_fail_unheld) for steps with
-- a key only, in a statement of their own (Citus allows no such function in an
-- UPDATE's RETURNING).
CREATE FUNCTION cyclone._key_wake(p_action text, p_key text, p_limit integer,
                                  p_freed integer)
RETURNS text
-- PL/pgSQL: Citus cannot plan a SQL function's statement with parameters.
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN CASE WHEN (SELECT count(*) FROM (
                          SELECT 1 FROM cyclone.steps s
                           WHERE s.concurrency_key = p_key AND s.status = 'running'
                           LIMIT p_limit) n) + p_freed >= p_limit
                THEN p_action END;
END;
$$;

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
