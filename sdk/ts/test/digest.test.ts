// The arguments digest: the Python SDK's canonical JSON and SHA-256, and the replay
// check it allows.

import assert from "node:assert/strict";
import { test } from "node:test";

import { argsDigest, canonicalJson, digestOf, Failure, NotJsonError, type StepContext } from "../src/index.js";
import { DurableNode } from "../src/testing.js";

test("the digest of a call is that of [args, {}], as docs/other-languages.md gives it", () => {
  // printf '%s' '[["o-1",42],{}]' | sha256sum
  assert.equal(argsDigest(["o-1", 42]), "80c02077c1ec692fd7dc806b04719d2752139256d51c31e48f68c610cae457cd");
  assert.equal(argsDigest(["a"]), "ca1ab0b9c83ad0fd6b83db789f05103efd5efdcbe94811b686523fb2f1e33b8c");
});

test("canonical JSON writes keys, strings and numbers as Python's json module does", () => {
  const value = {
    b: [1, 2.5, 1e-5, 1.5e-7, 0.0001, -3, 1e100, true, null],
    a: 'é"\\\n\u0001\u2028',
    "\u{1F600}": 1,
    "\uffff": 2,
    z: { y: 0.1 },
  };
  assert.equal(
    canonicalJson(value),
    '{"a":"é\\"\\\\\\n\\u0001\u2028","b":[1,2.5,1e-05,1.5e-07,0.0001,-3,1e+100,true,null],"z":{"y":0.1},"\uffff":2,"\u{1F600}":1}',
  );
  // The same digest as the Python SDK's for [value, {}].
  assert.equal(digestOf([value, {}]), "59832b9fee69efc65b1c072513eee6af6ea15ecd885699f9fcaaa88a8e96061b");
  assert.equal(canonicalJson([2 ** 53, 1e16, 1.2345678901234567e20, 1e15 + 0.5, -0]), "[9007199254740992.0,1e+16,1.2345678901234567e+20,1000000000000000.5,0]");
});

test("a value that is not JSON has no digest", () => {
  assert.throws(() => argsDigest([10n]), NotJsonError);
  assert.throws(() => argsDigest([Number.NaN]), NotJsonError);
});

function charging(amount: number) {
  return async (ctx: StepContext): Promise<unknown> => {
    const id = await ctx.step("charge", () => `ch-${amount}`, { args: ["o-1", amount] });
    return { id };
  };
}

test("a step call with args records their digest, and a replay with the same ones is answered", async () => {
  const node = new DurableNode(charging(42));
  await node.run();
  assert.deepEqual(
    node.entries().map((e) => [e.stepId, e.argsDigest]),
    [["charge", argsDigest(["o-1", 42])]],
  );
  const again = await node.run();
  assert.deepEqual(again.output, { id: "ch-42" });
  assert.deepEqual(node.executions, { charge: 1 });
});

test("a replay that makes a recorded call with other arguments fails the node for good", async () => {
  const node = new DurableNode(charging(42));
  await node.run();
  const changed = new DurableNode(charging(43));
  for (const entry of node.entries()) changed.journal.set(entry.seq, entry);
  const result = await changed.run();
  assert.equal(result.status, "failed");
  assert.ok(result.failure instanceof Failure);
  assert.equal(result.failure.type, "ReplayMismatch");
  assert.equal(result.failure.nonRetryable, true);
  assert.match(result.failure.message, /step "charge" of charge was recorded with other arguments/);
});

test("an entry without a digest, or a call without args, is not checked", async () => {
  const plain = new DurableNode(async (ctx) => ({ id: await ctx.step("charge", () => "ch-1") }));
  await plain.run();
  const withArgs = new DurableNode(charging(42));
  for (const entry of plain.entries()) withArgs.journal.set(entry.seq, entry);
  assert.deepEqual((await withArgs.run()).output, { id: "ch-1" });
});
