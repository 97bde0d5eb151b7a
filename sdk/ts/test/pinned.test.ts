// A worker pinned to a Citus node (shardNode) names it when it opens its Work stream.

import assert from "node:assert/strict";
import { createServer, type Http2Session } from "node:http2";
import { test } from "node:test";

import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import { WorkerService } from "../src/gen/cyclone/v1/worker_service_pb.js";
import { Worker, type WorkerLogger } from "../src/index.js";

const quiet: WorkerLogger = { info: () => {}, warn: () => {}, error: () => {} };

test("a worker pinned to a node sends it when it opens its stream", { timeout: 10_000 }, async () => {
  const opened: string[] = [];
  let worker: Worker | undefined;
  const routes = (router: ConnectRouter) =>
    router.service(WorkerService, {
      async *work(requests) {
        for await (const request of requests) {
          if (request.open !== undefined) opened.push(request.open.shardNode);
          worker?.stop();
          throw new ConnectError("shard_node: the database is not distributed", Code.InvalidArgument);
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
    worker = new Worker({
      address: `127.0.0.1:${address.port}`,
      actions: { echo: () => 1 },
      shardNode: "worker-1:5432",
      logger: quiet,
    });
    await worker.run();
    assert.deepEqual(opened, ["worker-1:5432"]);
  } finally {
    // The worker's client keeps its connection: end it from this side.
    for (const session of sessions) session.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
