"""The engine's core behaviours, on a coordinator and two workers: the same tests as on
one Postgres (imported from their modules, so they cannot drift apart), run with the
Citus suite's fixtures (tests/citus/conftest.py). What they cover:
DAG order, SubmitOnce under concurrency, leases and the sweep, fencing (a stale token
is refused), Retry / RetryAll / Resolve, durable functions (step calls, their journal,
resolving them), CompleteMany, retention of runs and keys, run tags (stored, filtered,
paged, changed by SetRunTags, purged), waits and events, child runs (whose parent lives
on another shard), a wide fan-out's release in chunks, claims that hand a worker marked
unhealthy nothing, pauses of runs, workflows and actions, bulk actions (a batch of
runs on many shards acted on and the job's cursor moved in one transaction), and run
deadlines (a workflow's default applied where the run lives, the cancel at the deadline
fired by several servers, reaching a child on another shard).
The completion transaction from a worker, and what is Citus's own, are in
test_citus.py."""

from tests.test_blocked import (  # noqa: F401
    test_an_uncertain_outcome_in_complete_many_blocks_the_run_and_is_counted,
    test_resolve_discard_runs_the_step_again_on_the_next_claim,
    test_resolve_error_fails_the_step_so_compensation_runs,
    test_resolve_result_records_the_output_and_releases_downstream,
    test_retry_all_refuses_a_blocked_run,
    test_two_operators_resolving_at_once_one_wins_and_the_other_is_refused,
    test_unsafe_step_that_lost_its_lease_blocks_the_run,
)
from tests.test_bulk import (  # noqa: F401
    test_bulk_cancel_by_workflow_cancels_exactly_the_matching_running_runs,
    test_bulk_resolve_discard_releases_the_blocked_runs,
    test_bulk_retry_reopens_the_failed_runs,
    test_cancelling_a_job_stops_it_and_keeps_what_it_did,
    test_dry_run_counts_and_writes_nothing,
)
from tests.test_children import (  # noqa: F401
    test_a_cancelled_child_is_a_failed_wait,
    test_a_finished_child_wakes_its_waiting_parent,
    test_cancelling_a_child_leaves_its_parent_alone,
    test_cancelling_a_parent_cancels_its_descendants,
    test_start_child_submits_a_linked_run_and_journals_the_call,
)
from tests.test_operator_order import (  # noqa: F401
    test_a_running_node_below_a_retried_one_loses_its_lease_and_waits,
    test_retry_all_makes_a_cleanup_node_wait_for_its_reopened_upstream,
    test_retry_grants_the_node_a_fresh_attempt_budget,
)
from tests.test_pauses import (  # noqa: F401
    test_a_paused_action_is_not_claimed_until_resumed,
    test_a_paused_run_can_be_cancelled,
    test_a_paused_run_is_not_claimed_while_other_runs_are_until_resumed,
    test_a_paused_workflow_is_not_claimed_on_any_server_until_resumed,
    test_a_retry_of_a_paused_run_is_held_until_resume,
    test_a_running_step_completes_while_paused_and_its_dependents_wait_for_resume,
    test_an_event_for_a_paused_run_arrives_but_the_body_waits_for_resume,
    test_an_expired_lease_of_a_paused_run_is_swept_but_held,
    test_no_step_of_a_paused_run_starts_under_claims_from_three_servers,
    test_pausing_runs_refuses_bad_input_and_writes_nothing,
)
from tests.test_release_chunks import (  # noqa: F401
    test_a_cancelled_run_drops_its_release,
    test_a_discarded_roots_skips_are_counted_at_the_join_chunk_by_chunk,
    test_a_server_continues_the_release_its_completion_started,
    test_a_server_starting_finishes_a_release_left_half_way,
    test_retry_in_the_middle_of_a_release_counts_each_upstream_once,
    test_the_root_releases_its_first_chunk_and_the_rest_follow_a_chunk_a_call,
    test_two_continuers_at_once_count_each_chunk_once,
)
from tests.test_retention import (  # noqa: F401
    test_a_key_is_never_forgotten_while_its_run_exists,
    test_a_submit_once_key_outlives_its_deleted_run_for_the_key_retention,
    test_finished_runs_past_the_age_go_with_their_steps_and_the_rest_stay,
)
from tests.test_run_deadlines import (  # noqa: F401
    test_a_due_run_is_cancelled_by_one_pass_and_the_next_finds_nothing,
    test_a_run_finished_before_its_deadline_is_left_alone,
    test_a_run_is_cancelled_at_its_deadline_its_step_told_and_its_children_cancelled,
    test_a_workflow_default_applies_without_a_deadline_and_an_explicit_one_overrides_it,
    test_default_deadlines_are_set_replaced_listed_and_cleared,
    test_three_servers_cancel_each_run_at_its_deadline_once,
)
from tests.test_step_calls import (  # noqa: F401
    test_a_stale_token_is_aborted_and_writes_nothing,
    test_a_trailing_safe_failure_is_not_kept_but_a_handled_one_is,
    test_an_unsafe_call_started_by_an_earlier_attempt_blocks_the_run,
    test_resolve_discard_deletes_the_entry_so_the_call_runs_again,
    test_resolve_error_records_the_failure_for_the_body_to_handle,
    test_resolve_result_records_the_call_and_the_node_replays,
    test_the_claim_carries_the_journal_in_seq_order_and_retry_keeps_it,
)
from tests.test_step_calls_batched import (  # noqa: F401
    test_a_batch_of_step_calls_and_the_completion_after_them_commit_together,
    test_each_refused_step_call_stands_alone,
    test_unsafe_calls_begun_in_a_batch_get_each_their_decision,
)
from tests.test_steps import (  # noqa: F401
    test_a_step_that_runs_out_its_timeout_at_every_attempt_is_discarded_after_the_last,
    test_chain_runs_in_order_and_completes_the_run,
    test_complete_many_across_runs_completes_each_run,
    test_complete_many_applies_each_outcome_and_reports_each_in_request_order,
    test_concurrent_claims_never_hand_out_a_step_twice,
    test_diamond_join_waits_for_both_branches_and_sees_their_outputs,
    test_expired_lease_is_reclaimed_with_the_next_attempt,
    test_heartbeat_extends_the_lease_but_never_past_the_timeout,
    test_lease_expired_completion_is_refused_even_before_the_sweep,
    test_out_of_attempts_discards_skips_dependents_and_fails_the_run,
    test_repeated_complete_with_the_same_token_returns_the_recorded_result,
    test_retryable_failure_backs_off_then_runs_again_with_the_next_attempt,
    test_stale_token_is_refused_and_changes_nothing,
    test_the_background_sweep_reclaims_a_lost_lease_and_wakes_a_waiting_claim,
    test_waiting_claim_is_woken_by_a_submit,
)
from tests.test_submit import (  # noqa: F401
    test_a_keyed_run_takes_its_keys_name_based_id_the_same_in_sql_and_python,
    test_submit_creates_a_run_with_every_step_and_releases_only_roots,
    test_submit_once_keys_are_scoped_by_workflow_name,
    test_submit_once_makes_one_run_under_20_concurrent_calls,
    test_submit_once_returns_the_existing_run_and_says_so,
)
from tests.test_tags import (  # noqa: F401
    test_a_tag_filter_pages_to_older_runs_and_back,
    test_list_and_count_by_one_and_two_tags_with_status_and_workflow,
    test_retention_purges_a_runs_tags_with_it,
    test_set_run_tags_changes_them_with_an_audit_entry,
    test_set_run_tags_refusals,
    test_submit_once_repeated_keeps_the_first_calls_tags,
    test_tags_are_stored_and_shown_by_get_run_and_list_runs,
)
from tests.test_unhealthy_claims import (  # noqa: F401
    test_the_claims_of_a_sharded_database_hand_a_marked_worker_nothing,
)
from tests.test_waits import (  # noqa: F401
    test_a_dag_event_node_completes_with_the_payload,
    test_a_sleep_gives_up_the_lease_and_resumes_without_using_up_an_attempt,
    test_an_event_sent_before_the_wait_is_kept_and_one_after_wakes_the_node,
    test_an_event_timeout_fails_the_wait_with_event_timeout,
)
