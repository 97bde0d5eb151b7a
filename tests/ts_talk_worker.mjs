// A worker of the TypeScript SDK for tests/test_sdk_ts_talk.py, in plain JavaScript on
// the SDK's build (sdk/ts/dist): a body that emits to an output stream, and one that
// waits for two approvals (each URL it sends is printed as a JSON line), and bodies
// with query and update handlers.
//
//   node tests/ts_talk_worker.mjs ADDRESS

import { Worker } from "../sdk/ts/dist/src/index.js";

const [address] = process.argv.slice(2);

async function emitter(ctx) {
  await ctx.emit("tokens", "hello");
  await ctx.step("mark", async () => ctx.emit("tokens", { n: 1 }));
  await ctx.waitForEvent("go");
  await ctx.emit("tokens", "bye");
  return "done";
}

async function approve(ctx) {
  const sender = (step) => (approval) => {
    process.stdout.write(`${JSON.stringify({ sent: approval.url, run: ctx.runId, step, approvalId: approval.approvalId })}\n`);
  };
  const first = await ctx.waitForApproval(sender("approval"), { title: `refund ${ctx.runInput.amount}`, timeoutMs: 3_600_000 });
  const second = await ctx.waitForApproval(sender("boss"), { stepId: "boss" });
  return { first, second };
}

async function cart(ctx) {
  const items = [];
  ctx.query("items", () => [...items]);
  ctx.query("has", (item) => items.includes(item));
  ctx.update("add_item", (item) => {
    if (!item) throw new Error("an item needs a name");
    items.push(item);
    return items.length;
  });
  await ctx.step("tick", () => 0);
  await ctx.waitForEvent("checkout");
  return { user: ctx.runInput, items };
}

// Its step "gate" returns once an update was delivered to the body: the update is
// applied when the step returns.
async function live(ctx) {
  const seen = [];
  ctx.query("seen", () => seen);
  ctx.query("page", (n) => {
    if (n > seen.length) throw new RangeError(`no page ${n}`);
    return seen[n - 1];
  });
  ctx.update("push", (x) => seen.push(x));
  seen.push(await ctx.step("first", () => 1));
  await ctx.step("gate", async () => {
    while (!ctx.journal.handlers.pending) await new Promise((resolve) => setTimeout(resolve, 20));
  });
  return seen;
}

// "cart" is also the action of the Python SDK's durable function "cart"
// (tests/test_queries_updates.py): this body resumes its journal.
const actions = { "ts.emitter": emitter, "ts.approve": approve, "ts.cart": cart, "ts.live": live, cart };
const worker = new Worker({ address, claimWaitMs: 2000, actions });
await worker.run({ handleSignals: true });
