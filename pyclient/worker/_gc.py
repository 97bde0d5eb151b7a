"""Fewer runs of Python's cycle collector while a worker serves.

A worker makes a dozen tracked objects per step (its context, control, run, the
handler's coroutine) that live until the step's report is answered, a round trip
later. At the interpreter's default first threshold (700 allocations) the collector
runs every few dozen steps and traverses the steps in flight each time, about a tenth
of a busy worker's instructions (``bench/sdk_worker_cpu.py`` under callgrind). While
any worker of the process serves, the first threshold is raised to GEN0_THRESHOLD, and
put back when the last one stops. A threshold the program chose itself (anything but
the interpreter's default) is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

#: CPython's default first threshold, the only one changed here.
PYTHON_DEFAULT_GEN0 = 700
#: The first threshold while a worker serves: up to this many objects more are kept
#: between collections (a few megabytes at the most), each collection a millisecond.
GEN0_THRESHOLD = 10_000

_lock = threading.Lock()
_serving = 0
_saved: tuple[int, ...] | None = None


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """While this block runs (a worker serving), the raised first threshold."""
    global _serving, _saved
    with _lock:
        if _serving == 0:
            threshold = gc.get_threshold()
            if threshold[0] == PYTHON_DEFAULT_GEN0:
                _saved = threshold
                gc.set_threshold(GEN0_THRESHOLD, *threshold[1:])
        _serving += 1
    try:
        yield
    finally:
        with _lock:
            _serving -= 1
            if _serving == 0 and _saved is not None:
                # Unless the program set its own meanwhile.
                if gc.get_threshold()[0] == GEN0_THRESHOLD:
                    gc.set_threshold(*_saved)
                _saved = None
