#!/usr/bin/env bash
# The Citus suite (tests/citus/, docs/scaling.md), a part of `make test-all` (and all of
# `make test-citus`): Cyclone's engine tests on a coordinator and two workers that the
# suite starts and stops with tests/citus/cluster.sh. Citus must be installed for
# Debian's PostgreSQL 15: `make citus` (tests/citus/build.sh) does it once, from the
# source that CITUS_SOURCE names.
#
#   tests/citus.sh [more pytest arguments]
#   CYCLONE_CITUS_URL=postgresql://... tests/citus.sh   # an existing cluster instead
#
# Without Citus the suite cannot run: with CYCLONE_TEST_ALL=1 (make test-all and
# make test-citus set it) that is a failure, otherwise it is skipped with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/missing_tool.sh

bin=${PG15_BIN:-/usr/lib/postgresql/15/bin}
lib=$("$bin/pg_config" --pkglibdir 2>/dev/null || echo "$bin/../lib")
if [[ -z ${CYCLONE_CITUS_URL:-} && ! -f $lib/citus.so ]]; then
    missing_tool "the Citus suite needs Citus for PostgreSQL 15 ($lib/citus.so): build it once with CITUS_SOURCE=/path/to/citus-13.2.2-src.tar.gz make citus, or set CYCLONE_CITUS_URL"
fi
echo "== the Citus suite: a coordinator and two workers"
CYCLONE_TEST_CITUS=1 .venv/bin/pytest tests/citus "$@"
