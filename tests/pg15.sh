#!/usr/bin/env bash
# The engine's tests on the lowest supported PostgreSQL (15), a part of `make test-all`
# (and all of `make test-pg15`), on a throwaway cluster of Debian's packaged server that
# this script starts and stops.
#
#   tests/pg15.sh [more pytest arguments]
#
# runs tests/ without tests/sdk (the SDK does not see the server's Postgres), the chaos
# soak (which brings its own Postgres), the browser tests and the tests of the Go and
# TypeScript SDKs (markers browser and polyglot: the console and the other languages
# reach the engine through the same RPCs and SQL functions that the Python tests of
# this pass call); PG15_TESTS replaces that selection. PG15_BIN names the directory of initdb and pg_ctl (default: Debian's
# /usr/lib/postgresql/15/bin). The cluster listens on a private Unix socket only, with
# trust authentication, under a temporary directory removed at exit. initdb refuses to
# run as root, so as root the cluster runs as the postgres user.
#
# Without PostgreSQL 15 the tests cannot run: with CYCLONE_TEST_ALL=1 (make test-all and
# make test-pg15 set it) that is a failure, otherwise they are skipped with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/missing_tool.sh

BIN=${PG15_BIN:-/usr/lib/postgresql/15/bin}
if [[ ! -x $BIN/initdb || ! -x $BIN/pg_ctl ]]; then
    missing_tool "the PostgreSQL 15 pass needs PostgreSQL 15 ($BIN/initdb not found): apt-get install postgresql-15, or set PG15_BIN to the bin directory of any PostgreSQL 15"
fi
version=$("$BIN/pg_ctl" --version)
[[ $version == *" 15."* ]] || { echo "tests/pg15.sh: $BIN is not PostgreSQL 15: $version" >&2; exit 1; }

dir=$(mktemp -d /tmp/cyclone-pg15.XXXXXX)
as_owner=()
if [[ $(id -u) == 0 ]]; then
    chown postgres: "$dir"
    as_owner=(runuser -u postgres --)
fi
port=$((20000 + RANDOM % 20000))
stop() {
    "${as_owner[@]}" "$BIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT

"${as_owner[@]}" "$BIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync \
    >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
# Tests for durability kill processes, not this cluster: fsync off only makes it quicker.
"${as_owner[@]}" "$BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -s start \
    -o "-p $port -k $dir -c listen_addresses='' -c fsync=off -c max_connections=200" \
    || { cat "$dir/server.log" >&2; exit 1; }

export CYCLONE_TEST_DATABASE_URL="postgresql://postgres@/postgres?host=$dir&port=$port"
echo "== engine tests on $("$BIN/postgres" --version)"
read -r -a selection <<<"${PG15_TESTS:-tests --ignore=tests/sdk --ignore=tests/test_chaos.py --ignore=tests/test_console.py}"
markers=(-m "not browser and not polyglot")
[[ -z ${PG15_TESTS:-} ]] || markers=()
.venv/bin/pytest "${selection[@]}" "${markers[@]}" "$@"
