"""`make chaos`, shortened so that `make test-all` runs it: 200 runs, a quarter of them
durable bodies, while worker processes are SIGKILLed every 0.5-2 s, the server once,
and Postgres crashes once (its own Postgres, so the suite's shared one is left
alone); halfway, every worker restarts on a durable body with a patch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
LAST_LINE = re.compile(
    r"runs=(\d+) completed=(\d+) lost=(\d+) ledger_duplicates=(\d+) "
    r"audit_duplicates=(\d+) handler_calls=(\d+) kills=(\d+) "
    r"durable_runs=(\d+) step_calls=(\d+) durable_duplicates=(\d+) "
    r"attempt_duplicates=(\d+) merged_logs=(\d+) moved_past_reruns=(\d+)"
)


@pytest.mark.timeout(300)
def test_a_short_soak_loses_no_run_and_writes_each_ledger_row_once():
    """Also for durable bodies: each step call's ledger row, written in the step's own
    transaction with cyclone.step_call_record, exists once. Through the Postgres crash
    too, no attempt of a step reaches two handler calls, and no attempt keeps the log
    lines of two executions."""
    soak = subprocess.Popen(
        [
            sys.executable,
            "bench/chaos.py",
            "--runs",
            "200",
            "--server-kills",
            "1",
            "--postgres-restarts",
            "1",
            "--rate",
            "20",
            "--timeout",
            "200",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = soak.communicate(timeout=260)
    except subprocess.TimeoutExpired:
        soak.terminate()  # it stops its processes and its Postgres on SIGTERM
        output, _ = soak.communicate(timeout=30)
        pytest.fail(f"the soak did not end:\n{output}")
    lines = output.strip().splitlines()
    match = LAST_LINE.fullmatch(lines[-1])
    assert match, output
    (
        runs,
        completed,
        lost,
        ledger_dups,
        _audit_dups,
        calls,
        kills,
        durable,
        step_calls,
        dups,
        attempt_dups,
        merged_logs,
        moved_past,
    ) = map(int, match.groups())
    assert (runs, completed, lost, ledger_dups) == (200, 200, 0, 0), output
    assert (durable, dups) == (50, 0), output
    assert (attempt_dups, merged_logs, moved_past) == (0, 0, 0), output
    assert soak.returncode == 0, output
    # Each node of every run ran at least once: three per DAG run, one body per durable
    # run, whose five step calls ran at least once each.
    assert calls >= 3 * (runs - durable) + durable
    assert step_calls >= 5 * durable
    assert "server_kills=1 postgres_crashes=1" in lines[-3], output
    # The patch deployed mid-soak: some durable runs took it, none decided it twice.
    patch = re.search(
        r"patch: deployed_after=(\d+) patched_runs=(\d+) .*patch_mismatches=(\d+)", output
    )
    assert patch, output
    assert int(patch[2]) > 0 and int(patch[3]) == 0, output
    assert kills >= 3
