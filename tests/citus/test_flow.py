"""Flow control, Explain and schedules on a coordinator and two workers: the same tests
as on one Postgres (imported, so they cannot drift apart), run with the Citus suite's
fixtures. Rate limits and concurrency keys count across runs, and so across shards:
on Citus the claim admits such steps under locks on the coordinator
(step_claim_flow, docs/scaling.md); Explain reads the counts of other steps across
shards. A schedule another server is firing is passed by, not waited for: on Citus
by its own test (test_citus.py), as a server there holds it otherwise."""

from tests.test_explain import (  # noqa: F401
    test_a_blocked_run_explains_its_uncertain_node_and_holds_the_others,
    test_a_cancelled_run_says_who_cancelled_it_and_why,
    test_a_compensation_node_skipped_because_nothing_failed_says_so,
    test_a_failed_attempt_backs_off_until_its_retry_time,
    test_a_leased_node_names_its_worker_and_last_heartbeat,
    test_a_node_after_an_unfinished_one_waits_on_it,
    test_a_ready_node_nobody_asks_for_is_said_to_have_no_worker,
    test_a_skipped_node_names_the_failure_that_made_it_skip,
    test_explain_refuses_unknown_runs_and_nodes,
    test_ready_and_queued_say_which_worker_asks_and_what_is_ahead,
)
from tests.test_flow import (  # noqa: F401
    test_a_batch_across_actions_takes_the_highest_priorities,
    test_a_full_key_is_passed_over_and_frees_a_slot_when_a_step_ends,
    test_a_key_with_limit_two_never_has_three_running_across_servers,
    test_a_rate_limit_admits_count_claims_per_window,
    test_a_run_submitted_to_start_later_is_claimed_only_then,
    test_a_step_that_frees_its_keys_slot_wakes_a_claim_waiting_for_it,
    test_a_waiting_claim_wakes_at_the_start_time,
    test_a_waiting_claim_wakes_when_the_rate_window_opens,
    test_claims_of_a_rate_limited_action_stay_within_the_limit_across_servers,
    test_claims_take_higher_priorities_first_and_each_priority_in_order,
    test_explain_counts_the_steps_ahead_in_claim_order,
    test_explain_says_a_ready_step_waits_for_its_actions_rate,
    test_explain_says_a_ready_step_waits_for_its_full_concurrency_key,
)
from tests.test_schedules import (  # noqa: F401
    test_a_due_interval_schedule_submits_one_run_keyed_by_its_fire_time,
    test_overlap_skip_submits_nothing_while_the_last_run_runs,
)
