"""Output streams: handlers emit chunks (ctx.emit, EmitChunks), readers follow them
(ReadStream, Client.read_stream, AsyncClient.read_stream, `cyclone stream`).

Chunks are stored in order with who wrote them; a live reader gets each as it is stored
and ends when the run ends; a chunk emitted again with the same identity (a replay) is
not stored twice; only the holder of the node's lease writes; the server's bounds refuse
what is past them, and the handler sees it; retention deletes the chunks with their run.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import socket
import threading
from typing import Any

import grpc

from cyclone.v1 import (
    worker_service_pb2,
    worker_service_pb2_grpc,
    workflow_service_pb2,
    workflow_service_pb2_grpc,
)
from pyclient import AsyncClient, Client, RetryPolicy, StreamFull, Worker, Workflow, step
from pyclient.cli import main
from tests.console_thread import ConsoleThread
from tests.helpers import PATIENCE, claim, complete, eventually, node, rpc_error, submit, workflow
from tests.sdk.conftest import running
from tests.test_console_html import Browserless


def emit(server: Any, step_: Any, *chunks: tuple[str, str, int, Any], token: str | None = None):
    """EmitChunks for a claimed step: each chunk (stream, step_id, seq, data); a str is
    text, anything else JSON."""
    items = []
    for stream, step_id, seq, data in chunks:
        item = worker_service_pb2.ChunkToEmit(stream=stream, step_id=step_id, seq=seq)
        if isinstance(data, str):
            item.text = data
        else:
            item.json = json.dumps(data)
        items.append(item)
    return server.workers.EmitChunks(
        worker_service_pb2.EmitChunksRequest(
            run_id=step_.run_id,
            node=step_.node,
            lease_token=token or step_.lease_token,
            chunks=items,
        )
    )


def read(server: Any, run_id: str, stream: str, offset: int = 0, wait: bool = False) -> list:
    request = workflow_service_pb2.ReadStreamRequest(
        run_id=run_id, stream=stream, from_offset=offset, no_wait=not wait
    )
    return list(server.workflows.ReadStream(request, timeout=PATIENCE))


def texts(chunks: list) -> list[str]:
    return [c.text if c.WhichOneof("data") == "text" else json.loads(c.json) for c in chunks]


def test_chunks_are_stored_in_order_with_who_wrote_them_and_a_repeat_is_a_duplicate(
    cyclone_server,
):
    run_id = submit(cyclone_server, workflow("s", node("a"), node("b")))
    a, b = sorted(claim(cyclone_server), key=lambda s: s.node)
    first = emit(cyclone_server, a, ("tokens", "", 1, "Hel"), ("tokens", "", 2, "lo"))
    assert list(first.offsets) == [0, 1] and list(first.duplicate) == [False, False]
    # Another node's chunks take the next offsets of the same stream.
    assert list(emit(cyclone_server, b, ("tokens", "", 1, {"n": 1})).offsets) == [2]
    # A replay of node a sends its two chunks again, then a new one inside a step call.
    again = emit(
        cyclone_server,
        a,
        ("tokens", "", 1, "Hel"),
        ("tokens", "", 2, "lo"),
        ("tokens", "f", 1, "!"),
    )
    assert list(again.offsets) == [0, 1, 3] and list(again.duplicate) == [True, True, False]
    got = read(cyclone_server, run_id, "tokens")
    assert texts(got) == ["Hel", "lo", {"n": 1}, "!"]
    assert [(c.offset, c.node, c.step_id, c.attempt) for c in got] == [
        (0, "a", "", 1),
        (1, "a", "", 1),
        (2, "b", "", 1),
        (3, "a", "f", 1),
    ]
    assert all(c.HasField("emitted_at") for c in got)
    # From an offset; another stream is empty, not an error.
    assert texts(read(cyclone_server, run_id, "tokens", 2)) == [{"n": 1}, "!"]
    assert read(cyclone_server, run_id, "other") == []
    listed = cyclone_server.workflows.ListStreams(
        workflow_service_pb2.ListStreamsRequest(run_id=run_id)
    )
    assert [(s.name, s.chunks, s.bytes) for s in listed.streams] == [("tokens", 4, 14)]


def test_only_the_holder_of_the_lease_writes(cyclone_server):
    run_id = submit(cyclone_server, workflow("s", node("a")))
    [held] = claim(cyclone_server, lease=5)
    stale = "00000000-0000-4000-8000-000000000000"
    error = rpc_error(emit, cyclone_server, held, ("out", "", 1, "x"), token=stale)
    assert error.code() == grpc.StatusCode.ABORTED
    # Once the lease ran out, the attempt that held it writes nothing either.
    cyclone_server.advance_clock(6)
    error = rpc_error(emit, cyclone_server, held, ("out", "", 1, "x"))
    assert error.code() == grpc.StatusCode.ABORTED
    assert read(cyclone_server, run_id, "out") == []
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.stream_chunks") == [(0,)]


def test_bounds_refuse_the_whole_call_and_say_which(server_factory):
    server = server_factory(
        max_stream_chunk_bytes=10, max_stream_bytes_per_run=25, max_stream_chunks_per_run=4
    )
    run_id = submit(server, workflow("s", node("a")))
    [held] = claim(server)
    error = rpc_error(emit, server, held, ("out", "", 1, "x" * 11))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-stream-chunk-bytes" in error.details()
    emit(server, held, ("out", "", 1, "x" * 10), ("out", "", 2, "y" * 10))
    # 5 more bytes fit; 6 do not, and nothing of the call is stored.
    error = rpc_error(emit, server, held, ("out", "", 3, "z"), ("out", "", 4, "z" * 5))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "full" in error.details() and "25 bytes" in error.details()
    assert texts(read(server, run_id, "out")) == ["x" * 10, "y" * 10]
    emit(server, held, ("out", "", 3, "z"), ("b", "", 1, "w"))
    error = rpc_error(emit, server, held, ("c", "", 1, ""))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "4 chunks" in error.details()
    # A repeat of a stored chunk is answered even when the streams are full.
    assert list(emit(server, held, ("out", "", 1, "x" * 10)).duplicate) == [True]


def test_bad_chunks_are_invalid(cyclone_server):
    submit(cyclone_server, workflow("s", node("a")))
    [held] = claim(cyclone_server)
    for chunk in [("", "", 1, "x"), ("out", "", 0, "x"), ("bad\nname", "", 1, "x")]:
        error = rpc_error(emit, cyclone_server, held, chunk)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, chunk
    bad_json = worker_service_pb2.ChunkToEmit(stream="out", seq=1, json="{nope")
    error = rpc_error(
        cyclone_server.workers.EmitChunks,
        worker_service_pb2.EmitChunksRequest(
            run_id=held.run_id, node=held.node, lease_token=held.lease_token, chunks=[bad_json]
        ),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "JSON" in error.details()
    unknown = workflow_service_pb2.ReadStreamRequest(
        run_id="00000000-0000-4000-8000-000000000000", stream="out"
    )
    error = rpc_error(lambda r: list(cyclone_server.workflows.ReadStream(r)), unknown)
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_a_live_reader_gets_each_chunk_as_it_is_stored_and_ends_with_the_run(cyclone_server):
    run_id = submit(cyclone_server, workflow("s", node("a")))
    [held] = claim(cyclone_server)
    got: list[str] = []
    done = threading.Event()

    def follow() -> None:
        with Client(cyclone_server.address) as client:
            for chunk in client.read_stream(run_id, "tokens"):
                got.append(chunk.data)
        done.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    for i in range(1, 4):
        emit(cyclone_server, held, ("tokens", "", i, f"t{i}"))
        # Each chunk reaches the reader while the run is still running.
        eventually(lambda i=i: len(got) == i, f"chunk {i} read live")
    assert not done.is_set()
    complete(cyclone_server, held, "ok")
    assert done.wait(PATIENCE), "the reader ended with the run"
    assert got == ["t1", "t2", "t3"]
    # A late reader from offset 0 gets everything, and ends at once: the run is over.
    with Client(cyclone_server.address) as client:
        assert [c.data for c in client.read_stream(run_id, "tokens")] == ["t1", "t2", "t3"]
        assert [c.offset for c in client.read_stream(run_id, "tokens", offset=1)] == [1, 2]
        [summary] = client.list_streams(run_id)
        assert (summary.name, summary.chunks) == ("tokens", 3)


def test_a_worker_handler_and_a_durable_body_emit_and_async_readers_follow(cyclone_server):
    worker = Worker(cyclone_server.address, concurrency=2, lease=10.0, claim_wait=1.0)
    gate = threading.Event()

    @step
    def shout(word: str) -> str:
        from pyclient import current

        current().emit("tokens", word.upper())  # inside the step call "shout"
        return word.upper()

    @worker.workflow("story")
    def story(ctx, data: dict) -> str:
        ctx.emit("tokens", "once")
        gate.wait(PATIENCE)
        loud = shout("upon")
        ctx.emit("tokens", {"done": True})
        return loud

    @worker.action("plain")
    def plain(ctx) -> None:
        ctx.emit("log", "plain handler")

    async def follow(run_id: str) -> list[Any]:
        async with AsyncClient(cyclone_server.address) as client:
            return [(c.data, c.step_id) async for c in client.read_stream(run_id, "tokens")]

    with Client(cyclone_server.address) as client, running(worker):
        run_id = client.start("story", {})
        eventually(lambda: client.list_streams(run_id) != [], "the first chunk")
        gate.set()
        got = asyncio.run(follow(run_id))
        wf = Workflow("plain")
        wf.node("plain", action="plain")
        plain_run = client.submit(wf)
        assert client.wait(plain_run, timeout=PATIENCE).status == "completed"
        assert [c.data for c in client.read_stream(plain_run, "log")] == ["plain handler"]
    assert got == [("once", ""), ("UPON", "shout"), ({"done": True}, "")]


def test_an_async_handler_emits_with_emit_async_and_not_with_the_blocking_emit(cyclone_server):
    worker = Worker(cyclone_server.address, concurrency=2, lease=10.0, claim_wait=1.0)
    refused: list[str] = []

    @worker.action("poet")
    async def poet(ctx) -> int:
        offsets = [await ctx.emit_async("verse", word) for word in ("roses", "are", "red")]
        try:
            ctx.emit("verse", "blocked")  # would block the handlers' loop
        except RuntimeError as exc:
            refused.append(str(exc))
        return offsets[-1]

    wf = Workflow("poet")
    wf.node("poet", action="poet")
    with Client(cyclone_server.address) as client, running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
        assert run.status == "completed" and run.step("poet").output == 2
        assert [c.data for c in client.read_stream(run.run_id, "verse")] == ["roses", "are", "red"]
    assert refused and "emit_async" in refused[0]


def test_a_handler_sees_a_full_stream_as_an_exception(server_factory):
    server = server_factory(max_stream_chunks_per_run=2)
    worker = Worker(server.address, concurrency=1, lease=10.0, claim_wait=1.0)
    seen: list[str] = []

    @worker.action("chatty")
    def chatty(ctx) -> int:
        for i in range(5):
            try:
                ctx.emit("out", f"line {i}")
            except StreamFull as exc:
                seen.append(str(exc))
                raise
        return 0

    wf = Workflow("chatty")
    wf.node("chatty", action="chatty", retry=RetryPolicy(max_attempts=3))
    with Client(server.address) as client, running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
        # Refused for good: StreamFull fails the node without retries.
        assert run.status == "failed" and run.step("chatty").attempt == 1
        assert [c.data for c in client.read_stream(run.run_id, "out")] == ["line 0", "line 1"]
    assert len(seen) == 1 and "full" in seen[0]


def test_retention_deletes_the_chunks_with_their_run(cyclone_server):
    run_id = submit(cyclone_server, workflow("s", node("a")))
    [held] = claim(cyclone_server)
    emit(cyclone_server, held, ("out", "", 1, "x"), ("out", "", 2, "y"))
    complete(cyclone_server, held, "ok")
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.stream_chunks") == [(2,)]
    cyclone_server.advance_clock(8 * 86400)
    assert cyclone_server.call(cyclone_server.server.purge) == 1
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.stream_chunks") == [(0,)]
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.stream_usage") == [(0,)]
    request = workflow_service_pb2.ReadStreamRequest(run_id=run_id, stream="out")
    error = rpc_error(lambda r: list(cyclone_server.workflows.ReadStream(r)), request)
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_the_cli_prints_a_stream_live_until_the_run_ends(cyclone_server, capsys):
    run_id = submit(cyclone_server, workflow("s", node("a")))
    [held] = claim(cyclone_server)
    emit(cyclone_server, held, ("tokens", "", 1, "Hello, "), ("tokens", "", 2, {"k": 1}))
    status: list[int] = []
    with Client(cyclone_server.address) as client:
        printing = threading.Thread(
            target=lambda: status.append(main(["stream", run_id, "tokens"], client=client)),
            daemon=True,
        )
        printing.start()
        emit(cyclone_server, held, ("tokens", "", 3, "world"))
        complete(cyclone_server, held, "ok")
        printing.join(PATIENCE)
        assert not printing.is_alive() and status == [0]
        assert capsys.readouterr().out == 'Hello, \n{"k": 1}\nworld\n'
        # --from and --json: one object per chunk.
        assert main(["stream", run_id, "tokens", "--from", "2", "--json"], client=client) == 0
        [line] = capsys.readouterr().out.splitlines()
        assert json.loads(line)["data"] == "world" and json.loads(line)["offset"] == 2


def test_the_console_shows_a_runs_streams_and_refreshes_them_while_it_runs(cyclone_server):
    run_id = submit(cyclone_server, workflow("s", node("a")))
    [held] = claim(cyclone_server)
    emit(cyclone_server, held, ("tokens", "", 1, "<b>bold</b> "), ("tokens", "", 2, {"n": 2}))
    console = ConsoleThread(cyclone_server.address)
    try:
        visitor = Browserless(console.url)
        page = visitor.get(f"/runs/{run_id}")
        assert page.status == 200 and 'id="run-streams"' in page.text
        assert f'hx-get="/runs/{run_id}/streams"' in page.text  # live: polled
        shown = re.search(
            r'<pre class="stream" data-stream="tokens"[^>]*>(.*?)</pre>', page.text, re.S
        )
        assert shown, page.text
        assert html.unescape(shown.group(1)) == '<b>bold</b> \n{"n": 2}\n'
        assert "<b>bold</b>" not in page.text  # escaped
        emit(cyclone_server, held, ("tokens", "", 3, "more"))
        complete(cyclone_server, held, "ok")
        fragment = visitor.get(f"/runs/{run_id}/streams")
        assert fragment.status == 200 and "more" in fragment.text
        assert "hx-get" not in fragment.text  # the run is over: no more polls
    finally:
        console.stop()


def test_pyclient_testing_keeps_what_a_handler_emits_as_the_server_would():
    from pyclient import testing

    def chatty(ctx) -> str:
        ctx.emit("out", "one")
        ctx.emit("out", {"two": 2})
        return "ok"

    ctx = testing.make_context()
    assert testing.run(chatty, ctx) == "ok"
    # A retry emits the same chunks again: stored once, as the server stores them.
    testing.run_twice(chatty, ctx)
    assert testing.emitted(ctx) == {"out": ["one", {"two": 2}]}

    @step
    def loud(word: str) -> str:
        from pyclient import current

        current().emit("out", word.upper())
        return word.upper()

    def body(ctx, data: dict) -> str:
        ctx.emit("out", "start")
        said = loud("hi")
        ctx.emit("out", "end")
        return said

    node = testing.DurableNode(body, input={})
    assert node.run(crash="loud", when="after_record").status == "crashed"
    assert node.run().status == "completed"
    assert testing.emitted(node) == {"out": ["start", "HI", "end"]}


class Stubs:
    """The stubs the raw-API helpers call, on a server process's address."""

    def __init__(self, address: str) -> None:
        # A subchannel of its own: not one that the stopped server left in backoff.
        self.channel = grpc.insecure_channel(
            address, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.workflows = workflow_service_pb2_grpc.WorkflowServiceStub(self.channel)
        self.workers = worker_service_pb2_grpc.WorkerServiceStub(self.channel)


def test_a_reader_goes_on_from_where_it_was_when_its_server_restarts(server_process):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = ("--listen", f"127.0.0.1:{port}", "--metrics-listen", "off")
    first = server_process(*flags)
    server = Stubs(first.address)
    run_id = submit(server, workflow("s", node("a")))
    [held] = claim(server)
    emit(server, held, ("out", "", 1, "before"))
    got: list[str] = []

    def follow() -> None:
        with Client(first.address) as client:
            got.extend(c.data for c in client.read_stream(run_id, "out"))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    eventually(lambda: got == ["before"], "the first chunk read")
    first.stop()  # SIGTERM: the stopping server ends its readers with UNAVAILABLE
    server_process(*flags)  # back on the same address
    server.channel.close()
    server = Stubs(first.address)
    emit(server, held, ("out", "", 2, "after"))
    complete(server, held, "ok")
    reader.join(PATIENCE)
    assert not reader.is_alive() and got == ["before", "after"]
    server.channel.close()


def test_the_console_shows_the_end_of_a_long_stream(cyclone_server):
    run_id = submit(cyclone_server, workflow("s", node("a")))
    [held] = claim(cyclone_server)
    lines = [f"line {i:05}\n" for i in range(3000)]  # 33,000 characters
    for start in range(0, len(lines), 1000):
        batch = lines[start : start + 1000]
        emit(cyclone_server, held, *(("log", "", start + i + 1, t) for i, t in enumerate(batch)))
    console = ConsoleThread(cyclone_server.address)
    try:
        page = Browserless(console.url).get(f"/runs/{run_id}")
        pre = r'<pre class="stream" data-stream="log"[^>]*>(.*?)</pre>'
        shown = html.unescape(re.search(pre, page.text, re.S).group(1))
        assert shown.endswith("line 02999\n") and len(shown) <= 20_000
        assert (
            "line 00000" not in shown
            and "3,000 chunks" in page.text
            and "the last of it" in page.text
        )
    finally:
        console.stop()
