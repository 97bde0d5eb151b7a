// The completion transaction's SQL and its SQLSTATEs, on a fake node-postgres client.

import assert from "node:assert/strict";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";

import { Journal, LeaseLost, StepContext, type StepCallTransport } from "../src/index.js";
import { ClaimedStepSchema } from "../src/gen/cyclone/v1/worker_service_pb.js";
import { completeInTx, completeWith, type Queryable } from "../src/pg.js";

class FakeClient implements Queryable {
  readonly queries: string[] = [];
  released = 0;
  constructor(private readonly failWith?: string) {}

  async query(text: string): Promise<{ rows: unknown[]; rowCount: number | null }> {
    this.queries.push(text.split(" ")[0] === "SELECT" ? text.slice(0, 40) : text);
    if (this.failWith && text.includes("step_complete")) {
      throw Object.assign(new Error(`raised ${this.failWith}`), { code: this.failWith });
    }
    return { rows: [], rowCount: 1 };
  }

  release(): void {
    this.released++;
  }
}

function context(): StepContext {
  const step = create(ClaimedStepSchema, { runId: "r-1", node: "charge", leaseToken: "t-1", attempt: 1 });
  const journal = new Journal([], { runId: "r-1", node: "charge", leaseToken: "t-1", attempt: 1 }, {} as StepCallTransport);
  return new StepContext(step, journal, new AbortController().signal);
}

const COMPLETE = "SELECT run_status FROM cyclone.step_comp";

test("the writes and the completion commit in one transaction", async () => {
  const ctx = context();
  const client = new FakeClient();
  await completeWith(ctx, { connect: async () => client }, async (c) => {
    await c.query("INSERT INTO ledger VALUES (1)");
    return { booked: true };
  });
  assert.deepEqual(client.queries, ["BEGIN", "INSERT INTO ledger VALUES (1)", COMPLETE, "COMMIT"]);
  assert.equal(ctx.completedInTx, true);
  assert.equal(client.released, 1);
});

test("CY001 rolls back and throws LeaseLost; CY005 rolls back and counts as done", async () => {
  const lost = new FakeClient("CY001");
  const ctx = context();
  await assert.rejects(completeInTx(ctx, lost, 1), LeaseLost);
  assert.deepEqual(lost.queries, [COMPLETE, "ROLLBACK"]);
  assert.equal(ctx.completedInTx, false);

  const repeat = new FakeClient("CY005");
  const again = context();
  await completeInTx(again, repeat, 1);
  assert.deepEqual(repeat.queries, [COMPLETE, "ROLLBACK"]);
  assert.equal(again.completedInTx, true);
});

test("an output JSON cannot carry rolls back before anything is recorded", async () => {
  const client = new FakeClient();
  await assert.rejects(completeInTx(context(), client, { n: 1n }), /OutputNotJson|not JSON: a BigInt/);
  assert.deepEqual(client.queries, ["ROLLBACK"]);
});

test("a failing write rolls back and is the step's failure", async () => {
  const client = new FakeClient();
  await assert.rejects(
    completeWith(context(), { connect: async () => client }, async () => {
      throw new Error("duplicate key");
    }),
    /duplicate key/,
  );
  assert.deepEqual(client.queries, ["BEGIN", "ROLLBACK"]);
  assert.equal(client.released, 1);
});
