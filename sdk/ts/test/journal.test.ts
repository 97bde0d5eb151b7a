// The journal's replay rules, on the in-memory server of the testing helper.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Failure, NotJsonError, StepResultTooLarge, toPlainJson, type StepContext } from "../src/index.js";
import { StepCallStatus } from "../src/gen/cyclone/v1/types_pb.js";
import { DurableNode } from "../src/testing.js";

async function pricing(ctx: StepContext): Promise<unknown> {
  const a = await ctx.step("price", () => 10);
  const b = await ctx.step("price", () => 20);
  const c = await ctx.step("tax", () => a + b, { stepId: "vat" });
  return { total: a + b + c };
}

test("step calls get seqs and step ids, name#n for repeats, and are recorded", async () => {
  const node = new DurableNode(pricing);
  const result = await node.run();
  assert.equal(result.status, "completed");
  assert.deepEqual(result.output, { total: 60 });
  assert.deepEqual(
    node.entries().map((e) => [e.seq, e.stepId, e.function, e.status]),
    [
      [1, "price", "price", StepCallStatus.SUCCEEDED],
      [2, "price#2", "price", StepCallStatus.SUCCEEDED],
      [3, "vat", "tax", StepCallStatus.SUCCEEDED],
    ],
  );
});

test("a replay answers recorded calls from the journal without running them", async () => {
  const node = new DurableNode(pricing);
  await node.run();
  const again = await node.run();
  assert.deepEqual(again.output, { total: 60 });
  assert.deepEqual(node.executions, { price: 2, tax: 1 });
});

test("a crash after a safe call runs it again, and only it", async () => {
  const node = new DurableNode(pricing);
  assert.equal((await node.run({ crashAfter: "price#2" })).status, "crashed");
  assert.deepEqual((await node.run()).output, { total: 60 });
  assert.deepEqual(node.executions, { price: 3, tax: 1 });
});

test("a recorded failure is thrown again on replay, as a Failure with its type", async () => {
  let seen: string[] = [];
  const body = async (ctx: StepContext) => {
    try {
      await ctx.step("charge", () => {
        throw new Failure("declined", { type: "CardDeclined" });
      });
    } catch (error) {
      assert.ok(error instanceof Failure);
      seen.push(`${error.type}: ${error.message}`);
      await ctx.step("release", () => true);
      return "cancelled";
    }
    return "charged";
  };
  const node = new DurableNode(body);
  assert.equal((await node.run()).output, "cancelled");
  seen = [];
  assert.equal((await node.run()).output, "cancelled");
  assert.deepEqual(seen, ["CardDeclined: declined"]);
  assert.deepEqual(node.executions, { charge: 1, release: 1 });
});

test("a failure the body lets through is not kept: the retry calls the step again", async () => {
  let fail = true;
  const body = async (ctx: StepContext) => {
    await ctx.step("fetch", () => {
      if (fail) throw new Error("flaky");
      return "ok";
    });
    return "done";
  };
  const node = new DurableNode(body);
  const first = await node.run();
  assert.equal(first.status, "failed");
  assert.equal(node.entries().length, 0);
  fail = false;
  assert.equal((await node.run()).output, "done");
});

test("an unsafe call found started blocks the run until it is resolved", async () => {
  const body = async (ctx: StepContext) => {
    const paid = await ctx.unsafeStep("charge", () => ({ id: "ch_new" }));
    return paid;
  };
  const node = new DurableNode(body);
  assert.equal((await node.run({ crashAfter: "charge" })).status, "crashed");
  assert.equal(node.entry("charge")?.status, StepCallStatus.STARTED);
  const blocked = await node.run();
  assert.equal(blocked.status, "blocked");
  assert.equal(blocked.blockedOn, "charge");
  node.resolve("charge", { result: { id: "ch_found" } });
  assert.deepEqual((await node.run()).output, { id: "ch_found" });
  assert.deepEqual(node.executions, { charge: 1 });
});

test("an unsafe call resolved with an error is thrown as EffectFailed; discarded, it runs again", async () => {
  const body = async (ctx: StepContext) => {
    try {
      return await ctx.unsafeStep("charge", () => "charged");
    } catch (error) {
      return error instanceof Failure ? error.type : "?";
    }
  };
  const failed = new DurableNode(body);
  await failed.run({ crashAfter: "charge" });
  await failed.run();
  failed.resolve("charge", { error: "card declined" });
  assert.equal((await failed.run()).output, "EffectFailed");

  const discarded = new DurableNode(body);
  await discarded.run({ crashAfter: "charge" });
  await discarded.run();
  discarded.resolve("charge", { discard: true });
  assert.equal((await discarded.run()).output, "charged");
  assert.deepEqual(discarded.executions, { charge: 2 });
});

test("a body that changes its calls under a recorded journal fails with ReplayMismatch", async () => {
  let renamed = false;
  const body = async (ctx: StepContext) => {
    await ctx.step(renamed ? "quote" : "price", () => 1);
    return "ok";
  };
  const node = new DurableNode(body);
  await node.run();
  renamed = true;
  const result = await node.run();
  assert.equal(result.status, "failed");
  assert.ok(result.failure instanceof Failure);
  assert.equal(result.failure.type, "ReplayMismatch");
  assert.equal(result.failure.nonRetryable, true);
  assert.match(result.failure.message, /call #1 recorded step "price" of price; this replay makes step "quote" of quote/);
});

test("a step id used twice fails the node with DuplicateStepId", async () => {
  const body = async (ctx: StepContext) => {
    await ctx.step("a", () => 1, { stepId: "x" });
    await ctx.step("b", () => 2, { stepId: "x" });
  };
  const result = await new DurableNode(body).run();
  assert.equal((result.failure as Failure).type, "DuplicateStepId");
});

test("a module-qualified function name recorded before still matches", async () => {
  const node = new DurableNode(async (ctx) => ctx.step("charge", () => 5));
  await node.run();
  const entry = node.entry("charge");
  assert.ok(entry);
  entry.function = "shop.charge";
  assert.equal((await node.run()).output, 5);
});

test("patches: a new run records the marker; a run past that point keeps the old path", async () => {
  let patchedCode = false;
  const body = async (ctx: StepContext) => {
    let price = await ctx.step("price", () => 100);
    if (patchedCode && (await ctx.patched("discount"))) price = await ctx.step("discount", () => price - 10);
    await ctx.step("charge", () => price);
    await ctx.step("receipt", () => "sent");
    return price;
  };
  // The old code went past the patch's place (charge is recorded), then crashed.
  const old = new DurableNode(body);
  await old.run({ crashAfter: "receipt" });
  patchedCode = true;
  assert.equal((await old.run()).output, 100);
  assert.deepEqual(old.entries().map((e) => e.stepId), ["price", "charge", "receipt"]);

  const fresh = new DurableNode(body);
  assert.equal((await fresh.run({ crashAfter: "charge" })).status, "crashed");
  assert.deepEqual(fresh.entries().map((e) => [e.stepId, e.function]), [
    ["price", "price"],
    ["patch:discount", "cyclone.patch"],
    ["discount", "discount"],
  ]);
  assert.equal((await fresh.run()).output, 90);
});

test("a step result that is not JSON fails the node and names the cause", async () => {
  const result = await new DurableNode(async (ctx) => ctx.step("count", () => ({ n: 10n }))).run();
  assert.equal((result.failure as Failure).type, "StepCallError");
  assert.match(result.failure?.message ?? "", /a BigInt \(10n\).* at \$\.n/);
});

test("a step result over the payload limit is recorded as StepResultTooLarge, replayed the same", async () => {
  const body = async (ctx: StepContext) => {
    try {
      return await ctx.step("render", () => "x".repeat(2000));
    } catch (error) {
      assert.ok(error instanceof StepResultTooLarge);
      return { stored: true, size: error.size, limit: error.limit };
    }
  };
  const node = new DurableNode(body, { limits: { maxPayloadBytes: 1000 } });
  const first = await node.run();
  assert.deepEqual(first.output, { stored: true, size: 2003, limit: 1000 });
  assert.equal(node.entry("render")?.error?.type, "StepResultTooLarge");
  assert.deepEqual((await node.run()).output, first.output);
  assert.deepEqual(node.executions, { render: 1 });
});

test("the journal's length is capped: the call past it fails the node with JournalFull", async () => {
  const body = async (ctx: StepContext) => {
    for (let i = 0; i < 5; i++) await ctx.step("tick", () => i);
  };
  const result = await new DurableNode(body, { limits: { maxStepCalls: 3 } }).run();
  assert.equal((result.failure as Failure).type, "JournalFull");
});

test("JSON checks name what JSON cannot carry and where", () => {
  const cycle: Record<string, unknown> = { a: 1 };
  cycle.self = cycle;
  assert.throws(() => toPlainJson(cycle), (e: unknown) => e instanceof NotJsonError && e.path === "$.self" && /cycle/.test(e.message));
  assert.throws(() => toPlainJson({ items: [1, Number.NaN] }), /the number NaN at \$\.items\[1\]/);
  assert.throws(() => toPlainJson(new Map()), /a Map/);
  assert.deepEqual(toPlainJson({ when: new Date(0), skip: undefined, list: [1, "a", null] }), {
    when: "1970-01-01T00:00:00.000Z",
    list: [1, "a", null],
  });
  assert.equal(toPlainJson(undefined), null);
  // The same object twice is not a cycle.
  const shared = { x: 1 };
  assert.deepEqual(toPlainJson([shared, shared]), [{ x: 1 }, { x: 1 }]);
});
