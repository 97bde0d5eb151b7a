"""The step call running now, as its context sees it (``ctx.completion_tx()``)."""

from __future__ import annotations

from typing import Any

from cyclone.jsonvalue import dumps
from pyclient.durable._calls import Call, CallTx, JournalBackend


class StepScope:
    """The step call running now, as its context sees it: it opens the call's
    transaction when the function asks for it, once."""

    def __init__(self, call: Call, backend: JournalBackend):
        self.call = call
        self._backend: JournalBackend | None = backend
        self.tx: CallTx | None = None

    def connection(self) -> Any:
        if self._backend is None:
            raise RuntimeError(
                f"step call {self.call.step_id!r} is over: its completion_tx() is closed"
            )
        if self.tx is None:
            self.tx = self._backend.transaction(self.call)
        return self.tx.connection()

    def record(self, conn: Any, output: Any) -> None:
        try:
            text = dumps(output)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"a step call's output must be JSON: {exc}") from None
        if self._backend is None:
            raise RuntimeError(f"step call {self.call.step_id!r} is over")
        self._backend.record(self.call, conn, text)

    def close(self) -> CallTx | None:
        """The call is over: its transaction, if one was opened, to commit or roll back."""
        self._backend = None
        return self.tx
