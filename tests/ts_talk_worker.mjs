// A worker of the TypeScript SDK for tests/test_sdk_ts_talk.py, in plain JavaScript on
// the SDK's build (sdk/ts/dist): a body that emits to an output stream.
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

const actions = { "ts.emitter": emitter };
const worker = new Worker({ address, claimWaitMs: 2000, actions });
await worker.run({ handleSignals: true });
