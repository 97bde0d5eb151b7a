#!/usr/bin/env bash
# A throwaway Citus cluster on this machine: a coordinator and N workers, each its own
# PostgreSQL 15 server with Citus loaded (tests/citus/build.sh installs it), listening
# on 127.0.0.1 only with trust authentication for the `postgres` role.
#
#   tests/citus/cluster.sh start DIR PORT WORKERS DATABASE   e.g. start /tmp/citus 9700 2 cyclone
#   tests/citus/cluster.sh stop DIR
#
# start: the coordinator listens on PORT and worker i on PORT+i; each node's data is in
# DIR/nodePORT (made on first start, reused after), its log in DIR/nodePORT.log.
# DATABASE is created on every node with the citus extension, and the workers are
# registered with the coordinator. The coordinator is then
#     postgresql://postgres@127.0.0.1:PORT/DATABASE
# stop: stops every node under DIR (the data stays; remove DIR to forget it).
#
# Run as root, the servers run as the `postgres` system user (initdb refuses root);
# otherwise as the caller. PG15_BIN names the bin directory (default Debian's).
set -euo pipefail
bin=${PG15_BIN:-/usr/lib/postgresql/15/bin}
usage="usage: $0 start DIR PORT WORKERS DATABASE | stop DIR"
action=${1:?$usage}
dir=${2:?$usage}

as_owner=()
if [[ $(id -u) == 0 ]]; then
    as_owner=(runuser -u postgres --)
fi
run() { (cd / && "${as_owner[@]}" "$@"); }

case $action in
stop)
    for data in "$dir"/node*; do
        [[ -f $data/postmaster.pid ]] || continue
        run "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null || true
    done
    exit 0
    ;;
start) ;;
*)
    echo "$usage" >&2
    exit 2
    ;;
esac

port=${3:?$usage}
workers=${4:?$usage}
database=${5:?$usage}
[[ -x $bin/pg_ctl ]] || { echo "$bin/pg_ctl not found: install PostgreSQL 15 or set PG15_BIN" >&2; exit 1; }
[[ -f $("$bin/pg_config" --pkglibdir 2>/dev/null || echo "$bin/../lib")/citus.so ]] \
    || { echo "Citus is not installed for PostgreSQL 15: CITUS_SOURCE=/path/to/citus-src.tar.gz make citus" >&2; exit 1; }

mkdir -p "$dir"
if ((${#as_owner[@]})); then
    chown postgres: "$dir"
fi

sql() { # sql PORT DATABASE STATEMENT: one statement, its rows unaligned
    psql "postgresql://postgres@127.0.0.1:$1/$2" -X -q -t -A -v ON_ERROR_STOP=1 -c "$3"
}

for ((i = 0; i <= workers; i++)); do
    node_port=$((port + i))
    data=$dir/node$node_port
    if [[ ! -f $data/PG_VERSION ]]; then
        run "$bin/initdb" -D "$data" -U postgres -A trust -E UTF8 --no-sync >"$data.initdb.log" 2>&1 \
            || { cat "$data.initdb.log" >&2; exit 1; }
        # In the configuration file, so that a node restarted by hand (or by a test that
        # crashed it) comes back the same.
        cat >>"$data/postgresql.conf" <<EOF

# tests/citus/cluster.sh
shared_preload_libraries = 'citus'
port = $node_port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 200
EOF
    fi
    run "$bin/pg_ctl" -D "$data" -l "$data.log" -w start >/dev/null \
        || { tail -n 20 "$data.log" >&2; exit 1; }
    if [[ -z $(sql "$node_port" postgres "SELECT 1 FROM pg_database WHERE datname = '$database'") ]]; then
        sql "$node_port" postgres "CREATE DATABASE \"$database\"" >/dev/null
    fi
    sql "$node_port" "$database" "CREATE EXTENSION IF NOT EXISTS citus" >/dev/null
done

# Register the coordinator itself, then each worker not yet registered.
sql "$port" "$database" "SELECT citus_set_coordinator_host('127.0.0.1', $port)" >/dev/null
for ((i = 1; i <= workers; i++)); do
    sql "$port" "$database" "SELECT citus_add_node('127.0.0.1', $((port + i)))
        WHERE NOT EXISTS (SELECT FROM pg_dist_node WHERE nodeport = $((port + i)))" >/dev/null
done
echo "citus cluster: coordinator postgresql://postgres@127.0.0.1:$port/$database," \
    "$(sql "$port" "$database" "SELECT count(*) FROM citus_get_active_worker_nodes()") workers"
