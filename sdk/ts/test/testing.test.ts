// The testing helper: crashes, waits, children, and explore().

import assert from "node:assert/strict";
import { test } from "node:test";

import { Failure, fromValue, type StepContext } from "../src/index.js";
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

test("an approval is created and sent once, its wait resumes with the decision, and a replay sends nothing", async () => {
  const sent: string[] = [];
  const body = async (ctx: StepContext) => {
    const decision = await ctx.waitForApproval((approval) => void sent.push(approval.url), { title: "refund 20", timeoutMs: 3_600_000 });
    const second = await ctx.waitForApproval((approval) => void sent.push(approval.url), { stepId: "boss" });
    const third = await ctx.waitForApproval((approval) => void sent.push(approval.url));
    return { decision, second, third };
  };
  const node = new DurableNode(body);
  assert.equal((await node.run({ crashAfter: "approval" })).status, "crashed");
  assert.deepEqual(sent, ["/callbacks/token-approval-1-1"]);
  // The attempt was lost before the call's outcome was recorded: it runs again, with a new token.
  assert.equal((await node.run()).status, "suspended");
  assert.deepEqual(sent, ["/callbacks/token-approval-1-1", "/callbacks/token-approval-1-2"]);
  assert.equal(node.approvals.get("approval")?.title, "refund 20");
  node.sendEvent("approval:approval-1", { approved: true });
  assert.equal((await node.run()).status, "suspended"); // at the second approval
  node.sendEvent("approval:approval-2", { approved: false });
  assert.equal((await node.run()).status, "suspended"); // at the third
  node.sendEvent("approval:approval-3", "ok");
  const done = await node.run();
  assert.equal(done.status, "completed");
  assert.deepEqual(done.output, { decision: { approved: true }, second: { approved: false }, third: "ok" });
  assert.equal(sent.length, 4); // each approval sent once past the crash: no replay sent one again
  assert.deepEqual(
    node.entries().map((e) => [e.stepId, e.function]),
    [
      ["approval", "cyclone.approval"],
      ["approval.wait", "cyclone.event"],
      ["boss", "cyclone.approval"],
      ["boss.wait", "cyclone.event"],
      ["approval#2", "cyclone.approval"],
      ["approval#2.wait", "cyclone.event"],
    ],
  );
  const asked = node.entry("approval");
  assert.ok(asked?.output);
  const recorded = JSON.parse(JSON.stringify(fromValue(asked.output))) as Record<string, string>;
  assert.deepEqual(Object.keys(recorded).sort(), ["approval_id", "event", "expires_at"]); // never the token
  assert.match(recorded.expires_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00$/);
});

test("an approval's wait that outlives its token throws EventTimeout", async () => {
  const node = new DurableNode(async (ctx) => {
    try {
      return await ctx.waitForApproval(() => {}, { timeoutMs: 60_000 });
    } catch (error) {
      return error instanceof Failure ? error.type : "other";
    }
  });
  assert.equal((await node.run()).status, "suspended");
  node.advance(120_000);
  const done = await node.run();
  assert.equal(done.output, "EventTimeout");
});

test("an approval with a timeout under a second is refused before anything is journaled", async () => {
  const node = new DurableNode(async (ctx) => ctx.waitForApproval(() => {}, { timeoutMs: 10 }));
  const result = await node.run();
  assert.equal(result.status, "failed");
  assert.ok(result.failure instanceof Failure && result.failure.type === "InvalidArgument");
  assert.deepEqual(node.entries(), []);
});
