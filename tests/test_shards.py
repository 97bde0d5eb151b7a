"""The sharded path (service/schema/95_shards.sql) on one Postgres: a server told that
its database is sharded claims shard by shard (step_candidates_sharded,
step_claim_shard) and admits steps under flow control under the coordinator's locks
(step_claim_flow), applies CompleteMany outcome by outcome, purges by key and takes
turns to fire schedules, as it does on Citus; the same tests
as the set-based path, imported from their modules. tests/citus/ runs them on a
cluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from service.config import parse
from service.migrate import migrate
from tests.test_blocked import (  # noqa: F401
    test_an_uncertain_outcome_in_complete_many_blocks_the_run_and_is_counted,
    test_resolve_discard_runs_the_step_again_on_the_next_claim,
    test_unsafe_step_that_lost_its_lease_blocks_the_run,
)
from tests.test_flow import (  # noqa: F401
    test_a_full_key_is_passed_over_and_frees_a_slot_when_a_step_ends,
    test_a_key_with_limit_two_never_has_three_running_across_servers,
    test_a_rate_limit_admits_count_claims_per_window,
    test_a_waiting_claim_wakes_when_the_rate_window_opens,
    test_claims_of_a_rate_limited_action_stay_within_the_limit_across_servers,
    test_claims_take_higher_priorities_first_and_each_priority_in_order,
)
from tests.test_retention import (  # noqa: F401
    test_a_submit_once_key_outlives_its_deleted_run_for_the_key_retention,
    test_finished_runs_past_the_age_go_with_their_steps_and_the_rest_stay,
)
from tests.test_schedules import (  # noqa: F401
    test_a_schedule_another_server_holds_is_skipped_then_fired_once_its_holder_dies,
)
from tests.test_step_calls import (  # noqa: F401
    test_the_claim_carries_the_journal_in_seq_order_and_retry_keeps_it,
)
from tests.test_step_calls_batched import (  # noqa: F401
    test_each_refused_step_call_stands_alone,
)
from tests.test_steps import (  # noqa: F401
    test_claimed_step_carries_input_run_input_attempt_and_lease,
    test_complete_many_applies_each_outcome_and_reports_each_in_request_order,
    test_concurrent_claims_never_hand_out_a_step_twice,
    test_diamond_join_waits_for_both_branches_and_sees_their_outputs,
    test_expired_lease_is_reclaimed_with_the_next_attempt,
    test_out_of_attempts_discards_skips_dependents_and_fails_the_run,
    test_retryable_failure_backs_off_then_runs_again_with_the_next_attempt,
    test_the_background_sweep_reclaims_a_lost_lease_and_wakes_a_waiting_claim,
)
from tests.test_waits import (  # noqa: F401
    test_a_sleep_gives_up_the_lease_and_resumes_without_using_up_an_attempt,
)


@pytest.fixture
def server_factory(server_factory: Any) -> Iterator[Any]:
    """The plain fixture's servers, each told its database is sharded."""

    def start(**overrides: Any) -> Any:
        server = server_factory(**overrides)
        server.server.db.shard(True)
        return server

    yield start


def test_a_plain_database_is_not_sharded(cyclone_server):
    assert cyclone_server.sql("SELECT cyclone.sharded()") == [(False,)]


def test_citus_on_refuses_a_database_without_citus(database_url):
    with pytest.raises(RuntimeError, match="citus extension is not installed"):
        migrate(database_url, citus="on")
    assert migrate(database_url, citus="auto") == []  # nothing to distribute, no error


def test_the_citus_switch_is_auto_on_or_off():
    assert parse([]).citus == "auto"
    assert parse(["--citus", "off"]).citus == "off"
    with pytest.raises(SystemExit):
        parse(["--citus", "maybe"])


def test_a_plain_database_reads_its_reference_tables_by_their_own_names(cyclone_server):
    """_here names a node's copy of a reference table on Citus (tests/citus/test_routes.py);
    on a database that is not distributed, the table itself."""
    assert cyclone_server.sql("SELECT cyclone._here(ARRAY['clock', 'pauses'])") == [
        (["cyclone.clock", "cyclone.pauses"],)
    ]
