// A durable call's RPC against a server that accepts the connection and never answers.

import assert from "node:assert/strict";
import { createServer, type Http2Server, type Http2Session, type ServerHttp2Stream } from "node:http2";
import { test } from "node:test";

import { createClient } from "@connectrpc/connect";

import { Journal } from "../src/index.js";
import { WorkerService } from "../src/gen/cyclone/v1/worker_service_pb.js";
import { makeTransport } from "../src/transport.js";

interface Silent {
  server: Http2Server;
  port: number;
  streams: ServerHttp2Stream[];
  sessions: Http2Session[];
}

/** An HTTP/2 server that takes every request and answers none. */
async function silentServer(): Promise<Silent> {
  const streams: ServerHttp2Stream[] = [];
  const sessions: Http2Session[] = [];
  const server = createServer();
  server.on("session", (session) => sessions.push(session));
  server.on("stream", (stream) => streams.push(stream));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  assert.ok(address !== null && typeof address === "object");
  return { server, port: address.port, streams, sessions };
}

test("a call the server never answers fails after the call timeout, naming the call, and its function does not run", { timeout: 10_000 }, async () => {
  const { server, port, streams, sessions } = await silentServer();
  try {
    const client = createClient(WorkerService, makeTransport({ address: `127.0.0.1:${port}` }));
    const lease = { runId: "01a24800-0000-7000-8000-000000000001", node: "charge", leaseToken: "t", attempt: 1 };
    const journal = new Journal([], lease, client, undefined, undefined, undefined, 300);
    let ran = false;
    await assert.rejects(
      journal.step("charge_card", () => {
        ran = true;
        return 1;
      }, { unsafe: true }),
      /BeginStepCall for step call charge_card: DeadlineExceeded/,
    );
    assert.equal(ran, false);
    assert.equal(streams.length, 1);
  } finally {
    // The client keeps its connection: end it from this side, or close() waits for it.
    for (const session of sessions) session.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
