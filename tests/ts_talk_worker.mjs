// A worker of the TypeScript SDK for tests/test_sdk_ts_talk.py, in plain JavaScript on
// the SDK's build (sdk/ts/dist): a body that emits to an output stream, and one that
// waits for two approvals (each URL it sends is printed as a JSON line).
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

const actions = { "ts.emitter": emitter, "ts.approve": approve };
const worker = new Worker({ address, claimWaitMs: 2000, actions });
await worker.run({ handleSignals: true });
