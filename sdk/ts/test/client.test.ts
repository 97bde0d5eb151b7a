// What a client sees when no server answers: an error of its own kind, naming the cause.

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { test } from "node:test";

import { Client, Code, ConnectError, NotJsonError } from "../src/index.js";

/** A local port nobody listens on (taken, then given back). */
async function deadPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  assert.ok(address !== null && typeof address === "object");
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return address.port;
}

test("a call to a server that is gone rejects with Unavailable, naming the connection refused", async () => {
  const port = await deadPort();
  const client = new Client({ address: `127.0.0.1:${port}` });
  await assert.rejects(
    client.submit({ name: "w", nodes: [{ name: "a", action: "a" }] }),
    (error: unknown) =>
      error instanceof ConnectError && error.code === Code.Unavailable && error.message.includes(`127.0.0.1:${port}`),
  );
});

test("a query or update argument that JSON cannot carry is refused before anything is sent, naming it", async () => {
  const port = await deadPort(); // nothing may be sent: a call would fail with Unavailable
  const client = new Client({ address: `127.0.0.1:${port}` });
  await assert.rejects(client.query("r", "n", "items", ["ok", 10n]), (error: unknown) => {
    assert.ok(error instanceof NotJsonError);
    assert.match(error.message, /BigInt \(10n\).*at argument 2 \$/);
    return true;
  });
  await assert.rejects(client.update("r", "n", "add", [new Map()]), NotJsonError);
});
