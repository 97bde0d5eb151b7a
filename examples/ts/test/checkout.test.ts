// Unit tests of the pieces that need no server: `npm test` after `npm run build`.

import assert from "node:assert/strict";
import { test } from "node:test";

import { parseRunStatus, RunStatus, runStatusName, workflowToJson } from "@cyclone-workflows/sdk";

import { checkoutWorkflow, parseItem } from "../src/checkout.js";

test("the checkout workflow is the JSON a grpcurl user would send", () => {
  assert.deepEqual(workflowToJson(checkoutWorkflow), {
    name: "checkout",
    nodes: [
      { name: "price", action: "checkout.price", timeout: "30s" },
      {
        name: "charge",
        action: "checkout.charge",
        dependsOn: ["price"],
        retry: { maxAttempts: 3 },
        timeout: "60s",
      },
    ],
  });
});

test("an item is SKU:QTY:UNIT_PRICE_CENTS", () => {
  assert.deepEqual(parseItem("tea:2:450"), { sku: "tea", qty: 2, unit_price: 450 });
  for (const bad of ["tea", "tea:0:450", "tea:two:450", ":1:1", "tea:1:4.5"]) {
    assert.throws(() => parseItem(bad), /bad item/);
  }
});

test("run statuses read and print as lower-case words", () => {
  assert.equal(runStatusName(RunStatus.COMPLETED), "completed");
  assert.equal(parseRunStatus("Failed"), RunStatus.FAILED);
  assert.equal(parseRunStatus("unspecified"), undefined);
  assert.equal(parseRunStatus("done"), undefined);
});
