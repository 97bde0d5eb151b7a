#!/usr/bin/env node
// cyclone-ts-worker: a Cyclone worker in TypeScript, with @cyclone-workflows/sdk.
//
//   checkout.charge  books the checkout's total in the ledger table, in the same
//                    transaction as the step's completion (cyclone.step_complete):
//                    the charge is booked exactly once. Over --limit cents the card
//                    is declined, for good.
//   order.fulfil     a durable function: price_order, reserve_stock (its row written
//                    in the transaction that records the call), charge_card (unsafe
//                    to repeat: a worker killed during it blocks the run for an
//                    operator), send_receipt. A declined charge releases the stock
//                    and ends the order "cancelled". With --free-shipping, the next
//                    version of the body waives shipping behind the patch
//                    "free-shipping".
//
// Every step function of order.fulfil writes a row to order_log, so that you can count
// how many times each one really ran.
//
//   node dist/src/worker.js [--address HOST:PORT] [--database-url URL] [--limit CENTS]
//        [--gateway-delay-ms MS] [--concurrency N] [--lease-ms MS] [--free-shipping]
//
// SIGINT or SIGTERM stops claiming and waits for the steps in flight; a second signal
// exits at once.

import { parseArgs } from "node:util";

import { defaultAddress, Failure, nonRetryable, Worker, type StepContext } from "@cyclone-workflows/sdk";
import { completeWith, stepInTx, type Queryable } from "@cyclone-workflows/sdk/pg";
import pg from "pg";

const SCHEMA = `
CREATE TABLE IF NOT EXISTS ledger (
    run_id uuid    NOT NULL,
    node   text    NOT NULL,
    amount integer NOT NULL,
    PRIMARY KEY (run_id, node)
);
CREATE TABLE IF NOT EXISTS reservations (
    run_id   uuid    NOT NULL PRIMARY KEY,
    order_id text    NOT NULL,
    released boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS order_log (
    run_id uuid        NOT NULL,
    call   text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT now()
)`;

/** Shipping added to every order, in cents. */
const SHIPPING = 490;

const { values } = parseArgs({
  options: {
    address: { type: "string", default: defaultAddress() },
    "database-url": { type: "string", default: process.env.CYCLONE_DATABASE_URL ?? "" },
    limit: { type: "string", default: "100000" },
    "gateway-delay-ms": { type: "string", default: "0" },
    concurrency: { type: "string", default: "4" },
    "lease-ms": { type: "string", default: "30000" },
    "free-shipping": { type: "boolean", default: false },
  },
});

const limit = Number(values.limit);
const gatewayDelayMs = Number(values["gateway-delay-ms"]);
if (!values["database-url"]) {
  console.error("cyclone-ts-worker: no database: pass --database-url or set $CYCLONE_DATABASE_URL");
  process.exit(2);
}
const db = new pg.Pool({ connectionString: values["database-url"], max: 8 });

/** Waits `ms`, or throws the signal's reason when the step must stop first. */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason as Error);
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason as Error);
    }, { once: true });
  });
}

/** Notes that a step function ran. */
async function logCall(client: Queryable, ctx: StepContext, call: string): Promise<void> {
  await client.query("INSERT INTO order_log (run_id, call) VALUES ($1, $2)", [ctx.runId, call]);
}

async function charge(ctx: StepContext): Promise<void> {
  const price = ctx.upstreamOutput("price") as { amount?: unknown; currency?: unknown } | null;
  if (typeof price?.amount !== "number") throw nonRetryable("BadInput", "the price node's output has no amount");
  const amount = price.amount;
  if (amount > limit) throw nonRetryable("CardDeclined", `${amount} cents is over the card's limit of ${limit}`);
  ctx.log.info(`booking ${amount} cents`); // stored with the step: cyclone logs RUN charge
  // The row and the completion commit together; (run_id, node), the step's identity,
  // is the ledger's key as well.
  await completeWith(ctx, db, async (client) => {
    const inserted = await client.query(
      "INSERT INTO ledger (run_id, node, amount) VALUES ($1, $2, $3) ON CONFLICT (run_id, node) DO NOTHING",
      [ctx.runId, ctx.node, amount],
    );
    await pause(gatewayDelayMs, ctx.signal);
    return { charged: amount, currency: price.currency ?? "EUR", booked: inserted.rowCount === 1 };
  });
}

async function fulfil(ctx: StepContext): Promise<unknown> {
  const order = ctx.runInput as { order_id?: unknown; amount?: unknown } | null;
  if (typeof order?.order_id !== "string" || typeof order.amount !== "number") {
    throw nonRetryable("BadInput", "want {order_id, amount}");
  }
  const { order_id: orderId, amount } = order as { order_id: string; amount: number };

  let total = await ctx.step("price_order", async () => {
    await logCall(db, ctx, "price_order");
    return amount + SHIPPING;
  });
  if (values["free-shipping"] && (await ctx.patched("free-shipping"))) {
    const before = total;
    total = await ctx.step("waive_shipping", async () => {
      await logCall(db, ctx, "waive_shipping");
      return before - SHIPPING;
    });
  }

  const reservation = await stepInTx(ctx, db, "reserve_stock", async (client) => {
    await logCall(client, ctx, "reserve_stock");
    await client.query("INSERT INTO reservations (run_id, order_id) VALUES ($1, $2)", [ctx.runId, orderId]);
    return `r-${orderId}`;
  });

  let paid: { charge_id: string };
  try {
    paid = await ctx.unsafeStep("charge_card", async (signal) => {
      // The gateway takes the money at once; its answer may take a while.
      await logCall(db, ctx, "charge_card");
      if (total > limit) throw new Failure(`${total} cents is over the card's limit of ${limit}`, { type: "CardDeclined" });
      await pause(gatewayDelayMs, signal);
      return { charge_id: `ch_${orderId}` };
    });
  } catch (error) {
    if (!(error instanceof Failure) || error.nonRetryable) throw error;
    // The charge failed (now, or in an earlier attempt: the recorded failure is
    // thrown again): give the stock back, durably, and end the order.
    await ctx.step("release_stock", async () => {
      await logCall(db, ctx, "release_stock");
      await db.query("UPDATE reservations SET released = true WHERE run_id = $1", [ctx.runId]);
      return true;
    });
    return { status: "cancelled", reason: `${error.type}: ${error.message}` };
  }

  await ctx.step("send_receipt", async () => {
    await logCall(db, ctx, "send_receipt");
    return "sent";
  });
  return { status: "fulfilled", reservation, charge_id: paid.charge_id, charged: total };
}

async function main(): Promise<void> {
  await db.query(SCHEMA);
  const worker = new Worker({
    address: values.address,
    concurrency: Number(values.concurrency),
    leaseMs: Number(values["lease-ms"]),
    actions: {
      "checkout.charge": charge,
      "order.fulfil": fulfil,
    },
  });
  await worker.run({ handleSignals: true });
  await db.end();
}

main().catch((error: unknown) => {
  console.error("cyclone-ts-worker failed:", error);
  process.exit(1);
});
