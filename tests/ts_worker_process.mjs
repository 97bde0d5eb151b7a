// A worker of the TypeScript SDK for tests/test_sdk_ts.py, in plain JavaScript on the
// SDK's build (sdk/ts/dist): durable waits (a sleep, an event, a child run), and
// handlers that return what JSON cannot carry.
//
//   node tests/ts_worker_process.mjs ADDRESS [--claim]
//
// --claim: Claim and Complete instead of the Work stream.

import { Worker } from "../sdk/ts/dist/src/index.js";

const [address, mode] = process.argv.slice(2);

async function waits(ctx) {
  const first = await ctx.step("first", () => 1);
  await ctx.sleep(300);
  const approval = await ctx.waitForEvent("approved", { timeoutMs: 60_000 });
  const child = await ctx.startChild({ name: "kid", nodes: [{ name: "double", action: "ts.double" }] }, { n: 21 });
  const result = await child.result();
  const last = await ctx.step("last", () => 2);
  return { first, approval, child: result, last };
}

function double(ctx) {
  return { doubled: ctx.runInput.n * 2 };
}

function bigint() {
  return { total: 10n };
}

function cycle() {
  const order = { id: "o-1" };
  order.self = order;
  return order;
}

const worker = new Worker({
  address,
  workStream: mode !== "--claim",
  claimWaitMs: 2000,
  actions: { "ts.waits": waits, "ts.double": double, "ts.bigint": bigint, "ts.cycle": cycle },
});
await worker.run({ handleSignals: true });
