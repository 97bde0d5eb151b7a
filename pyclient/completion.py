"""The completion transaction: a handler's Postgres effects commit with its completion.

The worker keeps a psycopg pool of its own. A handler that calls
``ctx.completion_tx()`` gets a connection from it in an open transaction; when the
handler returns, :meth:`CompletionTx.commit` calls ``cyclone.step_complete`` in that
transaction and commits. The SQL function checks the lease token and raises SQLSTATE
CY001 when the lease was lost (the whole transaction, business writes included, rolls
back), CY002 for an unknown step, and CY005 when the step was already completed with
this token (a repeat: rolled back, so the effects are not committed twice). psycopg is
an optional dependency (the ``postgres`` extra), imported only when a worker is given a
database URL.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

from cyclone import codes
from pyclient.errors import CycloneError, error_for_kind

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

STEP_COMPLETE_SQL = "SELECT cyclone.step_complete(%s::uuid, %s, %s::uuid, %s::jsonb)"
#: A step call's success recorded in the caller's transaction (durable functions),
#: with the digest of its arguments (NULL for none).
STEP_CALL_RECORD_SQL = (
    "SELECT cyclone.step_call_record(%s::uuid, %s, %s::uuid, %s, %s, %s, %s::jsonb, %s)"
)


def open_pool(database_url: str, max_size: int) -> psycopg_pool.ConnectionPool:
    """A pool for completion transactions; ImportError names the extra to install."""
    try:
        import psycopg_pool
    except ImportError as exc:
        raise ImportError(
            "Worker(database_url=...) needs psycopg: pip install 'cyclone-workflows[postgres]'"
        ) from exc
    # check: a connection that died while idle in the pool (Postgres restarted, an
    # idle timeout, a failover) is replaced before a handler gets it, instead of
    # failing that handler's attempt.
    return psycopg_pool.ConnectionPool(
        database_url,
        min_size=0,
        max_size=max(1, max_size),
        open=True,
        name="cyclone-worker",
        check=psycopg_pool.ConnectionPool.check_connection,
    )


class CompletionTx:
    """One step's completion transaction, opened on first use. With ``call`` (step
    id, seq, function) and its ``args_digest``, the transaction of that step call of a
    durable function: its commit records the call's success
    (``cyclone.step_call_record``) instead of completing the step."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        run_id: str,
        node: str,
        lease_token: str,
        call: tuple[str, int, str] | None = None,
        *,
        args_digest: str = "",
    ):
        self._pool = pool
        self._sql = STEP_COMPLETE_SQL if call is None else STEP_CALL_RECORD_SQL
        self._key: tuple[Any, ...] = (run_id, node, lease_token, *(call or ()))
        self._digest: tuple[Any, ...] = () if call is None else (args_digest or None,)
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()

    @property
    def opened(self) -> bool:
        return self._conn is not None

    def connection(self) -> psycopg.Connection:
        with self._lock:
            if self._conn is None:
                self._conn = self._pool.getconn()
            return self._conn

    def commit(self, output_json: str) -> None:
        """Complete the step in the transaction and commit; LeaseLost when refused.
        A repeat of a completion that committed before is rolled back and returns: the
        step is done, and its effects were committed once, with the first."""
        conn = self._take()
        try:
            conn.execute(self._sql, (*self._key, output_json, *self._digest))
            conn.commit()
        except Exception as exc:
            _rollback(conn)
            if getattr(exc, "sqlstate", None) == codes.ALREADY_COMPLETED:
                return
            raise _translate(exc) from exc
        finally:
            self._pool.putconn(conn)  # the pool drops a broken connection

    def rollback(self) -> None:
        """Undo the handler's writes; a no-op when the handler never asked for them."""
        if self._conn is None:
            return
        conn = self._take()
        _rollback(conn)
        self._pool.putconn(conn)

    def _take(self) -> psycopg.Connection:
        with self._lock:
            conn, self._conn = self._conn, None
        assert conn is not None
        return conn


def record_step_call(
    conn: Any, key: tuple[Any, ...], output_json: str, args_digest: str = ""
) -> None:
    """Record a step call's success in ``conn``'s open transaction
    (``cyclone.step_call_record``; ``key`` is run_id, node, lease token, step id, seq,
    function; ``args_digest`` the digest of its arguments, "" for none). The engine's
    refusals are raised as SDK errors (LeaseLost...)."""
    try:
        conn.execute(STEP_CALL_RECORD_SQL, (*key, output_json, args_digest or None))
    except Exception as exc:
        translated = _translate(exc)
        if translated is exc:
            raise
        raise translated from exc


def _rollback(conn: Any) -> None:
    # A broken connection has nothing left to undo; the pool drops it.
    with contextlib.suppress(Exception):
        conn.rollback()


def _translate(exc: Exception) -> Exception:
    """The engine's refusals as SDK errors (LeaseLost, NotFound); anything else as is."""
    kind = codes.ENGINE_SQLSTATES.get(getattr(exc, "sqlstate", None) or "")
    if kind is None:
        return exc
    message = getattr(getattr(exc, "diag", None), "message_primary", None) or str(exc)
    error: CycloneError = error_for_kind(kind, message)
    return error
