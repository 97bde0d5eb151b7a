// Query and update handlers of a durable body: applied at journal points, recorded,
// replayed, and published.

import assert from "node:assert/strict";
import { test } from "node:test";

import { BodyHandlers, type JsonValue, type StepContext } from "../src/index.js";
import { DurableNode } from "../src/testing.js";

let applied = 0;

async function cart(ctx: StepContext): Promise<unknown> {
  const items: string[] = [];
  ctx.query("items", () => [...items]);
  ctx.query("has", (item: string) => items.includes(item));
  ctx.update("add_item", (item: string) => {
    if (!item) throw new Error("an item needs a name");
    applied++;
    items.push(item);
    return items.length;
  });
  await ctx.step("tick", () => 0);
  await ctx.waitForEvent("checkout");
  return items;
}

test("an update is applied at the next journal point, recorded after it, and applied again by a replay", async () => {
  applied = 0;
  const node = new DurableNode(cart);
  node.sendUpdate("add_item", ["apple"], { updateId: "u-1" });
  assert.equal((await node.run()).status, "suspended");
  assert.deepEqual(node.updateOutcome("u-1"), { update: "add_item", args: ["apple"], result: 1 });
  assert.deepEqual(
    node.entries().map((e) => [e.seq, e.stepId, e.function]),
    [
      [1, "tick", "tick"],
      [2, "update:u-1", "cyclone.update"],
      [3, "event:checkout", "cyclone.event"],
    ],
  );
  assert.deepEqual(node.query("items"), { value: ["apple"] });
  assert.deepEqual(node.query("has", ["apple"]), { value: true });
  node.sendEvent("checkout");
  const done = await node.run();
  assert.equal(done.status, "completed");
  assert.deepEqual(done.output, ["apple"]); // the replay applied it again, before the wait returned
  assert.equal(applied, 2); // once per attempt
  assert.equal(node.entries().length, 3); // recorded once
});

test("updates that fail or have no handler are recorded with their error, and change nothing on replay", async () => {
  applied = 0;
  const node = new DurableNode(cart);
  node.sendUpdate("add_item", [""], { updateId: "empty" });
  node.sendUpdate("remove_item", ["apple"], { updateId: "unknown" });
  node.sendUpdate("add_item", ["pear"], { updateId: "pear" });
  assert.equal((await node.run()).status, "suspended");
  assert.deepEqual(node.updateOutcome("empty"), { update: "add_item", args: [""], error: { type: "Error", message: "an item needs a name" } });
  assert.deepEqual(node.updateOutcome("unknown"), {
    update: "remove_item",
    args: ["apple"],
    error: { type: "UnknownUpdate", message: 'the body has no update handler "remove_item" (it has: add_item)' },
  });
  assert.deepEqual(node.updateOutcome("pear"), { update: "add_item", args: ["pear"], result: 1 });
  assert.deepEqual(node.query("nope"), { error: { type: "UnknownQuery", message: 'the body has no query handler "nope" (it has: has, items)' } });
  node.sendEvent("checkout");
  assert.deepEqual((await node.run()).output, ["pear"]);
});

test("a handler's publication carries the argument-less queries whose value changed", () => {
  const handlers = new BodyHandlers();
  const published: Record<string, JsonValue>[] = [];
  handlers.onPublish = (values) => published.push(Object.fromEntries(values));
  let count = 0;
  handlers.query("count", () => count);
  handlers.query("label", () => "same");
  handlers.query("with_args", (x: number) => x + count);
  handlers.publish();
  handlers.publish(); // nothing changed: nothing published
  count = 2;
  handlers.publish();
  assert.deepEqual(published, [{ count: 0, label: "same" }, { count: 2 }]);
});

test("an async update handler, or a query that answers with a Promise, is refused", () => {
  const handlers = new BodyHandlers();
  assert.throws(() => handlers.update("u", async () => 1), /must be a plain function, not async/);
  handlers.query("later", () => Promise.resolve(1));
  const answer = handlers.answer("later", []);
  assert.ok("error" in answer && /returned a Promise/.test(answer.error.message));
  assert.throws(() => handlers.query("", () => 1), /1-200 characters/);
});
