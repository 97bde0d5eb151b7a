-- The claim plans once per connection. PL/pgSQL plans its statements with the
-- arguments' values for the first five calls and then keeps a generic plan only if it
-- looks no dearer; the claim's "LIMIT p_limit" makes the generic plan look dearer than
-- it is, so every claim was planned afresh: about 0.45 ms of a 1.5 ms claim on the
-- benchmark machine. The generic plan is the same walk of the ready index either way.
ALTER FUNCTION cyclone.step_claim(text, text[], text[], integer, interval)
    SET plan_cache_mode = force_generic_plan;
