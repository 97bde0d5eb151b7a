"""Queries and updates of the durable functions a worker runs, through
WorkerService.Inbox (docs/durable-functions.md, "Queries and updates").

While the worker runs bodies, one task on its loop long-polls Inbox with their nodes
(one call at a time for all of them, renewed at least every POLL_WAIT): the queries
asked of them are answered at once, here, by the bodies' query handlers (read-only; a
body without a handler of that name answers UnknownQuery); the updates sent to them are
handed to their bodies, which apply and record them at their next journal point.
Answers and published query values go in a short Inbox of their own as soon as they
are ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import grpc

from cyclone.jsonvalue import dumps, from_value, json_value
from cyclone.v1 import worker_service_pb2 as pb
from pyclient.durable._handlers import BodyHandlers, Delivered
from pyclient.worker._common import RPC_TIMEOUT
from pyclient.worker._journal import Journaling

log = logging.getLogger("pyclient.worker")

#: How long one Inbox waits for a query or an update, in seconds.
POLL_WAIT = 2.0


@dataclass(slots=True)
class _Body:
    handlers: BodyHandlers
    attempt: int
    #: The highest update seq handed to this attempt of the body.
    cursor: int = 0
    published: dict[str, str] = field(default_factory=dict)


class BodyMessages:
    """The bodies a worker runs, their queries and updates (on the worker's loop)."""

    def __init__(self, journaling: Journaling):
        self.shared = journaling
        self.bodies: dict[tuple[str, str], _Body] = {}
        self._answers: list[pb.QueryAnswer] = []
        self._published: dict[tuple[str, str, str], pb.PublishedQuery] = {}
        self._poller: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None

    def add(self, step: pb.ClaimedStep, handlers: BodyHandlers) -> None:
        """A body starts (on the worker's loop)."""
        key = (step.run_id, step.node)
        self.bodies[key] = _Body(handlers, step.attempt)
        loop = self.shared.loop
        attempt = step.attempt

        def publish(values: dict[str, str]) -> None:
            loop.call_soon_threadsafe(self._publish, key, attempt, values)

        handlers.on_publish = publish
        if self._poller is None or self._poller.done():
            self._poller = self.shared.loop.create_task(self._poll())

    def remove(self, step: pb.ClaimedStep, handlers: BodyHandlers) -> None:
        """A body ended (its outcome came, or it was given up on): its last values are
        published, and it takes no more queries."""
        key = (step.run_id, step.node)
        body = self.bodies.get(key)
        if body is not None and body.handlers is handlers:
            del self.bodies[key]
        with contextlib.suppress(Exception):
            handlers.publish()
        handlers.on_publish = None

    # -- sending

    def _publish(self, key: tuple[str, str], attempt: int, values: dict[str, str]) -> None:
        for name, text in values.items():
            self._published[(*key, name)] = pb.PublishedQuery(
                run_id=key[0], node=key[1], attempt=attempt, name=name, value=json_value(text)
            )
        self._send_soon()

    def _send_soon(self) -> None:
        if self._sender is None or self._sender.done():
            self._sender = self.shared.loop.create_task(self._send())

    async def _send(self) -> None:
        """Answers and published values, in Inbox calls naming no node (no wait)."""
        while self._answers or self._published:
            request = pb.InboxRequest(answers=self._answers, published=self._published.values())
            self._answers, self._published = [], {}
            try:
                await self._inbox(request)
            except grpc.RpcError as exc:  # the asker times out; the next values go later
                log.warning("Inbox could not send answers or query values: %s", exc.details())
                return

    async def _inbox(self, request: pb.InboxRequest) -> pb.InboxResponse:
        server = self.shared.server
        timeout = RPC_TIMEOUT + (request.wait.seconds if request.HasField("wait") else 0)
        response: pb.InboxResponse = await server.stub.Inbox(
            request, timeout=timeout, metadata=server.metadata
        )
        return response

    async def fetch(self, run_id: str, node: str) -> None:
        """The updates (and queries) waiting for one body now, handed to it: its body
        is about to wait, and the node's lease goes with the Wait (docs/durable-functions.md,
        "Queries and updates"). A failure is logged: the update is then applied at the
        node's next wake, which the server makes at once."""
        request = pb.InboxRequest()
        request.nodes.add(run_id=run_id, node=node)
        try:
            response = await self._inbox(request)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                log.warning(
                    "Inbox could not fetch the updates of %s/%s: %s", run_id, node, exc.details()
                )
            return
        self._handle(response)

    # -- receiving

    async def _poll(self) -> None:
        """Long-poll Inbox while the worker runs bodies (every body it runs: a query of
        one without handlers is answered UnknownQuery, an update sent to it refused at
        its next journal point, rather than left to time out)."""
        failures = 0
        while self.bodies:
            request = pb.InboxRequest()
            request.wait.FromSeconds(int(POLL_WAIT))
            for (run_id, node), body in list(self.bodies.items()):
                request.nodes.add(run_id=run_id, node=node, after_update=body.cursor)
            try:
                response = await self._inbox(request)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.warning("the server has no Inbox: queries and updates are not served")
                    return
                failures += 1
                if failures == 1:
                    log.warning("Inbox failed: %s", exc.details())
                await asyncio.sleep(min(0.2 * 2**failures, 5.0))
                continue
            except asyncio.CancelledError:
                return
            failures = 0
            self._handle(response)

    def _handle(self, response: pb.InboxResponse) -> None:
        for update in response.updates:
            body = self.bodies.get((update.run_id, update.node))
            if body is None:
                continue
            body.cursor = max(body.cursor, update.seq)
            args = [from_value(v) for v in update.args.values]
            body.handlers.deliver(Delivered(update.update_id, update.name, args))
        for query in response.queries:
            answer = pb.QueryAnswer(query_id=query.query_id, run_id=query.run_id)
            body = self.bodies.get((query.run_id, query.node))
            if body is None:
                answer.error_type = "NotRunning"
                answer.error_message = f"node {query.node} is not running on this worker any more"
            else:
                args = [from_value(v) for v in query.args.values]
                value, error = body.handlers.answer(query.name, args)
                if error is None:
                    answer.result.CopyFrom(json_value(dumps(value)))
                else:
                    answer.error_type = error["type"]
                    answer.error_message = error["message"]
            self._answers.append(answer)
        if response.queries:
            self._send_soon()
