#!/usr/bin/env bash
# Runs the commands given (each one argument, a shell command line) at the same time: the
# first in the foreground, its output as it comes; the others with their output kept
# apart and printed whole, in the order given, once the first has ended and each of
# them has. Exits 1 if any of them failed. make test-all runs every test, the PostgreSQL
# 15 pass and the Citus suite this way: most of their time is spent waiting on servers,
# processes and timers, so together they take little more than the longest of them.
#
#   tests/together.sh ".venv/bin/pytest" "tests/pg15.sh -x" "tests/citus.sh"
set -uo pipefail
cd "$(dirname "$0")/.."

logs=$(mktemp -d /tmp/cyclone-together.XXXXXX)
first=$1
shift
pids=()
# Stopped early (an interrupt, a failure of this script): the commands still running
# are stopped too.
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$logs"' EXIT
n=0
for command in "$@"; do
    ( eval "exec $command" ) >"$logs/$n.log" 2>&1 &
    pids+=($!)
    n=$((n + 1))
done

failed=0
( eval "exec $first" ) || { echo "== $first failed"; failed=1; }
n=0
for command in "$@"; do
    rc=0
    wait "${pids[$n]}" || rc=$?
    echo "== $command (exit $rc)"
    cat "$logs/$n.log"
    [[ $rc == 0 ]] || failed=1
    n=$((n + 1))
done
exit $failed
