// What the Worker refuses before it connects.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Worker, type Handler } from "../src/index.js";

test("a worker without actions, or with an action that is not a handler, is refused naming it", () => {
  assert.throws(() => new Worker({ actions: {} }), /serves no action/);
  assert.throws(
    () => new Worker({ actions: { "order.fulfil": "fulfil" as unknown as Handler } }),
    /action "order.fulfil": expected a handler function/,
  );
  assert.throws(() => new Worker({ actions: { a: () => 1 }, limits: { maxStepCalls: 20_000 } }), /maxStepCalls 1-10000/);
});
