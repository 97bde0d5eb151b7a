"""What gRPC itself costs in Python per batch of a worker, with no Cyclone code: a
grpc.aio server whose handlers answer at once, and one asyncio client, in two
processes. Per batch the client either makes two unary calls (a Claim-sized request,
then a CompleteMany-sized one, as a worker on Claim and CompleteMany does), one unary
call, or sends one message on an open bidirectional stream and reads one answer (as a
worker on WorkerService.Work does). Prints the CPU each process spent per batch, read
from /proc (the server's) and process_time (the client's).

    python bench/grpc_calls.py [--batches 1500] [--clients 1]

docs/performance.md, "Commits and round trips", has the figures (one stream per worker).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from collections.abc import Awaitable, Callable

import grpc

#: Message sizes of a batch of 64 one-node steps: a claim's answer, a report.
STEPS = b"s" * 9600
REPORT = b"r" * 5800
CLAIM = b"c" * 64
SERVICE = "bench.Calls"


def serve(ports: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return STEPS

    async def stream(requests, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        async for _ in requests:
            yield STEPS

    async def main() -> None:
        server = grpc.aio.server()
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(port: int, server_pid: int, batches: int, clients: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        unary = channel.unary_unary(f"/{SERVICE}/Unary")
        streaming = channel.stream_stream(f"/{SERVICE}/Stream")

        async def two_calls() -> None:
            for _ in range(batches):
                await unary(CLAIM)
                await unary(REPORT)

        async def one_call() -> None:
            for _ in range(batches):
                await unary(REPORT)

        async def one_message() -> None:
            call = streaming()
            for _ in range(batches):
                await call.write(REPORT)
                await call.read()
            await call.done_writing()
            await call.read()

        ways: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("two unary calls (Claim, CompleteMany)", two_calls),
            ("one unary call", one_call),
            ("one message each way on a stream (Work)", one_message),
        ]
        for what, way in ways:
            await way()  # warm up
            server_before, client_before = cpu_s(server_pid), time.process_time()
            await asyncio.gather(*(way() for _ in range(clients)))
            n = batches * clients
            server_us = (cpu_s(server_pid) - server_before) / n * 1e6
            client_us = (time.process_time() - client_before) / n * 1e6
            print(f"{what:42} server {server_us:6.0f} us, client {client_us:6.0f} us per batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=1500)
    parser.add_argument("--clients", type=int, default=1)
    args = parser.parse_args()
    ports: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    server = multiprocessing.Process(target=serve, args=(ports,), daemon=True)
    server.start()
    try:
        assert server.pid is not None
        asyncio.run(measure(ports.get(timeout=30), server.pid, args.batches, args.clients))
    finally:
        server.kill()


if __name__ == "__main__":
    main()
