// The testing helper: crashes, waits, children, and explore().

import assert from "node:assert/strict";
import { test } from "node:test";

import { Failure, type StepContext } from "../src/index.js";
import { DurableNode, explore } from "../src/testing.js";

async function checkout(ctx: StepContext): Promise<unknown> {
  const order = ctx.runInput as { amount: number };
  const total = await ctx.step("price", () => order.amount + 5);
  const paid = await ctx.unsafeStep("charge", () => ({ charge_id: "ch_1", total }));
  await ctx.step("receipt", () => "sent");
  return paid;
}

test("explore crashes after every step call and the body recovers from each", async () => {
  const exploration = await explore(checkout, { runInput: { amount: 10 } });
  exploration.assertOk();
  assert.deepEqual(exploration.points.map((p) => p.stepId), ["price", "charge", "receipt"]);
  const charge = exploration.points[1];
  assert.deepEqual(charge.attempts.map((a) => a.status), ["crashed", "blocked", "completed"]);
  assert.equal(charge.executions.charge, 1);
});

test("explore reports a body that gives another answer after a crash", async () => {
  let runs = 0;
  const flaky = async (ctx: StepContext) => {
    await ctx.step("fetch", () => 1);
    return ++runs; // not from a step: differs at every replay
  };
  const exploration = await explore(flaky);
  assert.throws(() => exploration.assertOk(), /crash after fetch: its output/);
});

test("a sleep suspends the node until the clock passes its wake time", async () => {
  const node = new DurableNode(async (ctx) => {
    await ctx.step("before", () => 1);
    await ctx.sleep(60_000);
    return ctx.step("after", () => 2);
  });
  assert.equal((await node.run()).status, "suspended");
  assert.equal((await node.run()).status, "suspended");
  node.advance(60_000);
  assert.equal((await node.run()).output, 2);
  assert.deepEqual(node.executions, { before: 1, after: 1 });
});

test("an event wait returns the payload, or an EventTimeout failure once its timeout passed", async () => {
  const body = async (ctx: StepContext) => {
    try {
      return await ctx.waitForEvent("approved", { timeoutMs: 1000 });
    } catch (error) {
      return error instanceof Failure ? error.type : "?";
    }
  };
  const approved = new DurableNode(body);
  assert.equal((await approved.run()).status, "suspended");
  approved.sendEvent("approved", { by: "ada" });
  assert.deepEqual((await approved.run()).output, { by: "ada" });
  assert.equal(approved.entry("event:approved")?.function, "cyclone.event");

  const late = new DurableNode(body);
  await late.run();
  late.advance(1001);
  assert.equal((await late.run()).output, "EventTimeout");
});

test("a child run is started once and its result awaited", async () => {
  const node = new DurableNode(async (ctx) => {
    const child = await ctx.startChild({ name: "ship", nodes: [{ name: "go", action: "ship.go" }] }, { n: 1 });
    return child.result();
  });
  assert.equal((await node.run()).status, "suspended");
  assert.equal((await node.run()).status, "suspended");
  assert.equal(node.children.size, 1);
  node.finishChild("child-1", { outputs: { go: "shipped" } });
  assert.deepEqual((await node.run()).output, { run_id: "child-1", status: "completed", outputs: { go: "shipped" } });
  assert.deepEqual(node.entries().map((e) => e.stepId), ["child", "child.result"]);
});

test("a handler output that JSON cannot carry fails with an Error naming the cause", async () => {
  const result = await new DurableNode(async () => ({ big: 1n })).run();
  assert.equal(result.status, "failed");
  assert.match(result.failure?.message ?? "", /BigInt/);
});

test("a replay after a crash stores no chunk twice, and a step call's chunks are its own", async () => {
  const node = new DurableNode(async (ctx) => {
    await ctx.emit("tokens", "once");
    const loud = await ctx.step("shout", async () => {
      await ctx.emit("tokens", "UPON");
      return "UPON";
    });
    await ctx.emit("tokens", { said: loud });
    return loud;
  });
  assert.equal((await node.run({ crashAfter: "shout" })).status, "crashed");
  assert.equal((await node.run()).status, "completed");
  assert.deepEqual(node.streams, { tokens: ["once", "UPON", { said: "UPON" }] });
});
