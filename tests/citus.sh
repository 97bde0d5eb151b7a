#!/usr/bin/env bash
# `make test`, third pass: the Citus suite (tests/citus/, docs/scaling.md) on a local
# coordinator and two workers that the suite starts and stops (../shared/citus/cluster.sh,
# or CITUS_DIR). Citus must be installed for Debian's PostgreSQL 15: build it once with
# ../shared/citus/build.sh (as root, about 4 minutes). Without it the suite is skipped
# with a message; with CI=true a missing Citus is a failure.
#
#   tests/citus.sh [more pytest arguments]
#   CYCLONE_CITUS_URL=postgresql://... tests/citus.sh   # an existing cluster instead
set -euo pipefail
cd "$(dirname "$0")/.."

lib=/usr/lib/postgresql/15/lib
dir=${CITUS_DIR:-../shared/citus}
if [[ -z ${CYCLONE_CITUS_URL:-} && ! -f $lib/citus.so ]]; then
    cat >&2 <<EOF2
== make test: the Citus suite (tests/citus) DID NOT RUN: Citus is not installed for
   PostgreSQL 15 ($lib/citus.so not found). To enable it, build it once as root:
       $dir/build.sh
   (or point CYCLONE_CITUS_URL at a coordinator with workers added).
EOF2
    if [[ ${CI:-} == true ]]; then
        echo "CI=true: a missing Citus is a failure" >&2
        exit 1
    fi
    exit 0
fi
if [[ -z ${CYCLONE_CITUS_URL:-} && ! -x $dir/cluster.sh ]]; then
    echo "make test: $dir/cluster.sh not found: set CITUS_DIR to the folder of cluster.sh" >&2
    exit 1
fi
echo "== the Citus suite: a coordinator and two workers"
CYCLONE_TEST_CITUS=1 CITUS_DIR=$dir .venv/bin/pytest tests/citus "$@"
