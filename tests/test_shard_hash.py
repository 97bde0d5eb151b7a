"""The shard of a run id computed as Citus computes it (service/db/shard_hash.py): the
hash must be PostgreSQL's uuid_hash exactly, and the ranges must place each hash in the
shard whose bounds hold it. tests/citus/test_routes.py checks the shards on a cluster."""

from __future__ import annotations

import uuid

import psycopg

from service.db.shard_hash import ShardRanges, uuid_hash


def test_the_hash_of_a_run_id_is_postgres_uuid_hash(database_url: str) -> None:
    ids = [uuid.uuid4() for _ in range(3000)]
    ids += [uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1), uuid.UUID(int=1 << 127)]
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT uuid_hash(u) FROM unnest(%s::uuid[]) u", (ids,)).fetchall()
    assert [r[0] for r in rows] == [uuid_hash(i) for i in ids]
    assert any(h < 0 for h in map(uuid_hash, ids)), "a signed 32-bit integer"


def test_a_hash_falls_in_the_shard_whose_range_holds_it() -> None:
    # Four shards over the signed 32-bit integers, as Citus splits them, in any order.
    ranges = ShardRanges(
        [
            (0, 1073741823, 103),
            (-2147483648, -1073741825, 101),
            (1073741824, 2147483647, 104),
            (-1073741824, -1, 102),
        ]
    )
    for _ in range(500):
        run_id = uuid.uuid4()
        value = uuid_hash(run_id)
        expected = 101 + (value + 2147483648) // 1073741824
        assert ranges.shard_of(str(run_id)) == expected
    assert ranges.shard_of("not a uuid") is None
    assert ShardRanges().shard_of(str(uuid.uuid4())) is None
    assert not ShardRanges() and ranges
    # A range missing (a map read while a shard was split): no shard rather than a wrong one.
    gap = ShardRanges([(0, 2147483647, 7)])
    ids = [uuid.uuid4() for _ in range(200)]
    assert {gap.shard_of(str(i)) for i in ids if uuid_hash(i) < 0} == {None}
    assert {gap.shard_of(str(i)) for i in ids if uuid_hash(i) >= 0} == {7}
