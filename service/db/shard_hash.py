"""Which shard of the runs a run id falls in, computed as Citus computes it, so that a
server that routes (Pool.route) sends a call for any run, a new one included, straight
to the node of its shard without asking the database first.

Citus places a row of a hash-distributed table by the hash of its distribution column
that the column type's hash operator class gives: for uuid, PostgreSQL's ``uuid_hash``,
which is ``hash_bytes`` (Bob Jenkins's lookup3 hash, little-endian variant) over the 16
bytes of the id, read as a signed 32-bit integer. The shard is the one whose range
(``pg_dist_shard.shardminvalue .. shardmaxvalue``) holds that integer. A wrong answer
would cost a hop, never a wrong result (a node forwards a call for a shard it does not
hold), and tests/test_shard_hash.py checks this function against ``uuid_hash`` itself.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Sequence

_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def uuid_hash(run_id: uuid.UUID) -> int:
    """PostgreSQL's uuid_hash of ``run_id``, a signed 32-bit integer (as Citus reads it).

    A uuid is 16 bytes: lookup3 adds the first twelve to its three words and mixes
    them once, adds the last four to the first word, then applies its final mix."""
    raw = run_id.bytes
    w0, w1, w2, w3 = (int.from_bytes(raw[i : i + 4], "little") for i in range(0, 16, 4))
    a = b = c = (0x9E3779B9 + 16 + 3923095) & _MASK
    a = (a + w0) & _MASK
    b = (b + w1) & _MASK
    c = (c + w2) & _MASK
    # mix(a, b, c)
    a = ((a - c) & _MASK) ^ _rot(c, 4)
    c = (c + b) & _MASK
    b = ((b - a) & _MASK) ^ _rot(a, 6)
    a = (a + c) & _MASK
    c = ((c - b) & _MASK) ^ _rot(b, 8)
    b = (b + a) & _MASK
    a = ((a - c) & _MASK) ^ _rot(c, 16)
    c = (c + b) & _MASK
    b = ((b - a) & _MASK) ^ _rot(a, 19)
    a = (a + c) & _MASK
    c = ((c - b) & _MASK) ^ _rot(b, 4)
    b = (b + a) & _MASK
    # the last four bytes
    a = (a + w3) & _MASK
    # final(a, b, c)
    c = ((c ^ b) - _rot(b, 14)) & _MASK
    a = ((a ^ c) - _rot(c, 11)) & _MASK
    b = ((b ^ a) - _rot(a, 25)) & _MASK
    c = ((c ^ b) - _rot(b, 16)) & _MASK
    a = ((a ^ c) - _rot(c, 4)) & _MASK
    b = ((b ^ a) - _rot(a, 14)) & _MASK
    c = ((c ^ b) - _rot(b, 24)) & _MASK
    return c - (1 << 32) if c & 0x80000000 else c


class ShardRanges:
    """The hash ranges of the shards of the runs (shard_placements), to find a run's."""

    def __init__(self, ranges: Sequence[tuple[int, int, int]] = ()) -> None:
        """``ranges``: (low, high, shard) of each shard, in any order."""
        ordered = sorted(ranges)
        self._lows = [low for low, _, _ in ordered]
        self._ranges = ordered

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def shard_of(self, run_id: str) -> int | None:
        """The shard whose range holds ``run_id``'s hash; None when none does (no
        ranges known, or an id that is not a UUID)."""
        try:
            value = uuid_hash(uuid.UUID(run_id))
        except ValueError:
            return None
        at = bisect.bisect_right(self._lows, value) - 1
        if at < 0:
            return None
        low, high, shard = self._ranges[at]
        return shard if low <= value <= high else None
