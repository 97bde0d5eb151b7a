"""What the server's connections wait on during a drain, fan against throughput.

A sampler reads pg_stat_activity every 2 ms while the bench's workers drain one
10,000-leaf fan, then 10,000 one-node runs (both on one fresh database, REPEATS times).
For each drain it prints the share of the active client backends' samples on CPU and
in each wait event, and for the waits on a lock the commonest pairs of the waiting
statement and its blockers (pg_blocking_pids), with each blocker's state.
docs/performance.md, "Known and left alone", has the figures.

    .venv/bin/python bench/fan_waits.py [REPEATS]
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench

#: One row per active client backend of the database but this one's: its wait (or
#: none: on CPU), its statement's start, and its blockers' statements and states.
SAMPLE = """
SELECT a.wait_event_type, a.wait_event, left(regexp_replace(a.query, '\\s+', ' ', 'g'), 60),
       (SELECT string_agg(left(regexp_replace(b.query, '\\s+', ' ', 'g'), 60)
                          || ' [' || b.state || coalesce(':' || b.wait_event, '') || ']', ' | ')
          FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(a.pid)))
  FROM pg_stat_activity a
 WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
   AND a.backend_type = 'client backend' AND a.state = 'active'
"""


def sample(
    url: str, stop: threading.Event, waits: collections.Counter, locks: collections.Counter
) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            for kind, event, query, blockers in conn.execute(SAMPLE):
                waits[f"{kind}:{event}" if kind else "CPU"] += 1
                if kind == "Lock":
                    locks[query, blockers] += 1
            time.sleep(0.002)


def drain(server: bench.Server, url: str, label: str) -> None:
    bench.vacuumed(url)
    time.sleep(2)
    stop = threading.Event()
    waits: collections.Counter = collections.Counter()
    locks: collections.Counter = collections.Counter()
    sampler = threading.Thread(target=sample, args=(url, stop, waits, locks))
    sampler.start()
    started = time.monotonic()
    bench.join(bench.start_workers(server.address, "a", stream=True))
    took = time.monotonic() - started
    stop.set()
    sampler.join()
    total = sum(waits.values())
    shares = ", ".join(f"{k} {100 * n / total:.0f}%" for k, n in waits.most_common(6))
    print(f"{label}: {took:.2f} s, {total} samples: {shares}")
    print(f"  {sum(locks.values())} waits on a lock; the commonest waiter <= blockers:")
    for (query, blockers), n in locks.most_common(6):
        print(f"    {n} {query} <= {blockers}")


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    url = bench.fresh_database(bench.admin_url(None), "cyclone_fan_waits")
    server = bench.Server(url, bench.fan_flags(10000))
    try:
        for _ in range(repeats):
            bench.submit_many(
                server.address, [bench.fan_workflow("a", 10000, name="wide")], clients=1
            )
            drain(server, url, "fan")
            bench.submit_many(server.address, [bench.one_node("one", "a")] * 10000)
            drain(server, url, "throughput")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
