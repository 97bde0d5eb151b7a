// The TypeScript SDK's worker for the bench's languages scenario (bench/languages.py):
// serves one action with a no-op handler until SIGTERM, then exits 0.
//
//   node dist/worker.js --address A --action X [--concurrency N]

import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";

import { Worker, type WorkerLogger } from "@cyclone-workflows/sdk";

const { values } = parseArgs({
  options: {
    address: { type: "string" },
    action: { type: "string" },
    concurrency: { type: "string", default: "64" },
  },
});
if (!values.address || !values.action) {
  console.error("usage: worker.js --address HOST:PORT --action NAME [--concurrency N]");
  process.exit(2);
}

// A line per step would measure the logging, not the SDK: say only what goes wrong.
const quiet: WorkerLogger = {
  info: () => {},
  warn: (message, fields) => console.error("WARN", message, fields ?? {}),
  error: (message, fields) => console.error("ERROR", message, fields ?? {}),
};

const worker = new Worker({
  address: values.address,
  concurrency: Number(values.concurrency),
  actions: { [values.action]: () => null },
  logger: quiet,
});

const where = process.env.CYCLONE_BENCH_STARTUP_DIR;
if (where) {
  // The CPU spent starting, which the bench leaves out of the CPU per step.
  const { user, system } = process.cpuUsage();
  writeFileSync(join(where, String(process.pid)), String((user + system) / 1e6));
}

worker.run({ handleSignals: true }).then(
  () => process.exit(0),
  (error: unknown) => {
    console.error("bench worker failed:", error);
    process.exit(1);
  },
);
