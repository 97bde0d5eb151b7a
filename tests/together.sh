#!/usr/bin/env bash
# Runs the commands given (each one argument, split on spaces) at the same time, each
# with its output kept apart, then prints each command's output whole, in the order
# given, and exits 1 if any of them failed. make test-all runs the PostgreSQL 15 pass
# and the Citus suite this way: most of their time is spent waiting on servers and
# timers, so two at once take little more than the longer of them.
#
#   tests/together.sh "tests/pg15.sh -x" "tests/citus.sh"
set -uo pipefail
cd "$(dirname "$0")/.."

logs=$(mktemp -d /tmp/cyclone-together.XXXXXX)
trap 'rm -rf "$logs"' EXIT
pids=()
n=0
for command in "$@"; do
    # shellcheck disable=SC2086  # each command is words to split
    ( exec $command ) >"$logs/$n.log" 2>&1 &
    pids+=($!)
    n=$((n + 1))
done

failed=0
n=0
for command in "$@"; do
    wait "${pids[$n]}"
    rc=$?
    echo "== $command (exit $rc)"
    cat "$logs/$n.log"
    [[ $rc == 0 ]] || failed=1
    n=$((n + 1))
done
exit $failed
