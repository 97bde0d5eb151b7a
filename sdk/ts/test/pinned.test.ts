// A worker pinned to a Citus node (shardNode) names it when it opens its Work stream,
// and a worker the server refuses for good stops with the server's error.

import assert from "node:assert/strict";
import { createServer, type Http2Session } from "node:http2";
import { test } from "node:test";

import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import { WorkerService } from "../src/gen/cyclone/v1/worker_service_pb.js";
import { Worker, type WorkerLogger } from "../src/index.js";

const quiet: WorkerLogger = { info: () => {}, warn: () => {}, error: () => {} };

/** A server whose Work stream refuses every open with ``code``; the opens it saw. */
async function refusing(code: Code, run: (address: string) => Promise<void>): Promise<string[]> {
  const opened: string[] = [];
  const routes = (router: ConnectRouter) =>
    router.service(WorkerService, {
      async *work(requests) {
        for await (const request of requests) {
          if (request.open !== undefined) opened.push(request.open.shardNode);
          throw new ConnectError("refused", code);
        }
        yield* []; // answers nothing: the open is refused
      },
    });
  const server = createServer(connectNodeAdapter({ routes }));
  const sessions: Http2Session[] = [];
  server.on("session", (session) => sessions.push(session));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  assert.ok(address !== null && typeof address === "object");
  try {
    await run(`127.0.0.1:${address.port}`);
  } finally {
    // The worker's client keeps its connection: end it from this side.
    for (const session of sessions) session.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
  return opened;
}

function refusedWith(code: Code): (error: unknown) => boolean {
  return (error) => error instanceof ConnectError && error.code === code;
}

test("a worker pinned to a node sends it when it opens its stream, and stops when it is refused", { timeout: 10_000 }, async () => {
  const opened = await refusing(Code.InvalidArgument, async (address) => {
    const worker = new Worker({ address, actions: { echo: () => 1 }, shardNode: "worker-1:5432", logger: quiet });
    await assert.rejects(worker.run(), refusedWith(Code.InvalidArgument));
  });
  assert.deepEqual(opened, ["worker-1:5432"]);
});

test("a worker refused for its credentials stops with the server's error instead of retrying", { timeout: 10_000 }, async () => {
  for (const code of [Code.Unauthenticated, Code.PermissionDenied]) {
    const opened = await refusing(code, async (address) => {
      const worker = new Worker({ address, actions: { echo: () => 1 }, logger: quiet });
      await assert.rejects(worker.run(), refusedWith(code));
    });
    assert.deepEqual(opened, [""]);
  }
});
