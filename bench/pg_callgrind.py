"""Postgres's instructions per step of a drain, counted by callgrind: a measure that
does not move with the load of a shared machine, for A/B comparisons of the engine's
SQL (docs/performance.md, "Tools for one part at a time").

For each of two sizes (--small, --large steps) it makes a fresh cluster of the given
Postgres (default Debian's PostgreSQL 15), creates the engine from this checkout's
service/schema (service.migrate.migrate on an empty database), runs --setup, loads
one-node runs with cyclone.run_submit (as bench/pg_drain.py does), stops it, and
drains it in single-user mode under
`valgrind --tool=callgrind`: per batch of 64, step_claim into an unlogged scratch table,
then step_complete_many of those items, each statement its own transaction (with -j a
single-user backend ends a command at a semicolon followed by an empty line, which the
script writes after each statement; without it the whole drain would run as one
transaction: no commit would be counted, and each completion would pay a foreign-key
check that the server's never do, because the step's row would have been written by
the same transaction). Prints the
total instructions of each run and the difference per step between them, which leaves
out start-up and catalog loading. The scratch table and the building of the items
(jsonb_build_object, uuid_in) are the harness's, included in the figure on both sides.

    .venv/bin/python bench/pg_callgrind.py
    .venv/bin/python bench/pg_callgrind.py --setup "DROP INDEX cyclone.runs_finished_idx"
    .venv/bin/python bench/pg_callgrind.py --fan    # one run: a root, a fan-out, a join

With --fan, each size is one run of that many steps (a root, a fan-out of all but two,
a join), as the bench's fan scenario: the difference per step is then what one more
leaf costs (its release, claim and completion, and its count at the join). Past the
first 1,000 leaves the release goes on a chunk per batch (release_continue), as the
server's release loop would count it. Every run is checked to have completed every
step.

Needs valgrind. About a minute per side.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pg_drain

CLAIM = (
    "INSERT INTO public.scratch SELECT run_id, node, lease_token FROM cyclone.step_claim("
    "'w', ARRAY['a'], '{}', 64, interval '60 s');\n\n"
)
COMPLETE = (
    "SELECT count(*) FROM cyclone.step_complete_many((SELECT jsonb_agg(jsonb_build_object("
    "'i', i - 1, 'run_id', run_id, 'node', node, 'lease_token', lease_token, 'output', NULL))"
    " FROM (SELECT s.*, row_number() OVER () AS i FROM public.scratch s) x));\n\n"
    "DELETE FROM public.scratch;\n\n"
)
# A fan's release past its first 1,000 leaves (cyclone.releases): a chunk per batch, as
# the server's release loop would count it meanwhile.
CONTINUE = "SELECT count(cyclone.release_continue(x.run_id)) FROM cyclone.releases x;\n\n"
# Printed by the single-user backend at the end: the steps the drain left unfinished.
LEFT = "SELECT 'left=' || count(*) FROM cyclone.steps WHERE status <> 'completed';\n\n"


def instructions(
    pgbin: Path,
    steps: int,
    setup: str,
    port: int,
    where: Path,
    keep: Path | None = None,
    fan: bool = False,
) -> int:
    from service.migrate import migrate

    base, url = pg_drain.start_cluster(pgbin, port, "-c autovacuum=off", where)
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        if setup:
            conn.execute(setup)
    (pg_drain.load_fan if fan else pg_drain.load)(url, steps, "a")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE UNLOGGED TABLE public.scratch (run_id uuid, node text, lease_token uuid)"
        )
        conn.execute("CHECKPOINT")
    subprocess.run(
        pg_drain.as_owner([str(pgbin / "pg_ctl"), "-D", str(base / "data"), "stop", "-m", "fast"]),
        check=True,
        capture_output=True,
    )
    script = base / "drain.sql"
    # A fan's first batch is its root alone, and its last its join: two more batches.
    batches = -(-steps // 64) + (2 if fan else 0)
    batch = CLAIM + COMPLETE + (CONTINUE if fan else "")
    script.write_text("SET cyclone.defer_notify = on;\n\n" + batch * batches + LEFT)
    out = base / "callgrind.out"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", str(pgbin / "postgres")]
    cmd += ["--single", "-D", str(base / "data"), "-j", "postgres"]
    with script.open() as stdin:
        done = subprocess.run(pg_drain.as_owner(cmd), stdin=stdin, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if not found or "ERROR" in done.stdout:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    left = re.search(r'"left=(\d+)"', done.stdout)
    if not left or left.group(1) != "0":
        raise RuntimeError(f"the drain left steps unfinished: {done.stdout[-500:]}")
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(out, keep / f"callgrind.{steps}.out")
    shutil.rmtree(base)
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    parser.add_argument("--small", type=int, default=640)
    parser.add_argument("--large", type=int, default=6400)
    parser.add_argument("--setup", default="", help="SQL to run after the migrations")
    parser.add_argument("--port", type=int, default=54339)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/cyclone-pg-callgrind"))
    parser.add_argument(
        "--keep",
        type=Path,
        help="copy each run's callgrind.out here (callgrind.STEPS.out), for callgrind_annotate",
    )
    parser.add_argument(
        "--fan",
        action="store_true",
        help="each size one run of a root, a fan-out and a join (default: one-node runs)",
    )
    args = parser.parse_args()
    small, large = (
        instructions(args.bin, n, args.setup, args.port, args.dir, args.keep, args.fan)
        for n in (args.small, args.large)
    )
    print(f"instructions: {small:,} for {args.small} steps, {large:,} for {args.large}")
    print(f"per step (the difference): {(large - small) // (args.large - args.small):,}")


if __name__ == "__main__":
    main()
