# Sourced by tests/pg15.sh and tests/citus.sh: the shell side of tests.helpers.missing_tool.
#
# missing_tool REASON ends a pass that needs a tool this machine lacks, saying REASON in
# one line: a failure (exit 1) under CYCLONE_TEST_ALL=1, which make test-all and its
# parts set so that every test runs; a skip (exit 0) otherwise.
missing_tool() {
    if [[ ${CYCLONE_TEST_ALL:-} == 1 ]]; then
        echo "FAILED: $1 (CYCLONE_TEST_ALL=1: every test must run)" >&2
        exit 1
    fi
    echo "SKIPPED: $1" >&2
    exit 0
}
