#!/usr/bin/env node
// cyclone-ts: submit a checkout, wait for a run, list runs.
//
//   node dist/src/main.js submit [--customer NAME] [--item SKU:QTY:CENTS]... [--key KEY] [--wait]
//   node dist/src/main.js wait RUN_ID
//   node dist/src/main.js list [--workflow NAME] [--status STATUS]... [--limit N]
//
// Every command takes --address HOST:PORT (default $CYCLONE_ADDRESS, else
// 127.0.0.1:50051), and --json to print runs as proto3 JSON, like grpcurl does.
// Exit status: 0 when the run (waited for) completed, 1 when it settled otherwise or
// the wait timed out, 2 on a usage or server error. --help prints the usage.

import { parseArgs } from "node:util";

import {
  Client,
  Code,
  ConnectError,
  defaultAddress,
  describeRun,
  parseRunStatus,
  RunStatus,
  runStatusName,
  runToJson,
  WaitTimeout,
  type Run,
} from "@cyclone-workflows/sdk";

import { checkoutWorkflow, parseItem, type Order } from "./checkout.js";

const USAGE = `usage:
  cyclone-ts submit [--customer NAME] [--item SKU:QTY:CENTS]... [--key KEY] [--wait] [--timeout SECONDS]
  cyclone-ts wait RUN_ID [--timeout SECONDS]
  cyclone-ts list [--workflow NAME] [--status STATUS]... [--limit N]
options for all: --address HOST:PORT (default $CYCLONE_ADDRESS, else 127.0.0.1:50051)  --json  --help`;

class UsageError extends Error {}

const OPTIONS = {
  help: { type: "boolean", short: "h", default: false },
  address: { type: "string", default: defaultAddress() },
  json: { type: "boolean", default: false },
  customer: { type: "string", default: "acme" },
  item: { type: "string", multiple: true },
  key: { type: "string" },
  wait: { type: "boolean", default: false },
  timeout: { type: "string", default: "60" },
  workflow: { type: "string" },
  status: { type: "string", multiple: true },
  limit: { type: "string", default: "20" },
} as const;

type Values = ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: true }>>["values"];

async function main(argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  address = values.address;
  const [command, ...rest] = positionals;
  const client = new Client({ address: values.address });
  switch (command) {
    case "submit":
      return submitCommand(client, values);
    case "wait":
      if (rest.length !== 1) throw new UsageError("wait takes one RUN_ID");
      return waitCommand(client, rest[0], values);
    case "list":
      return listCommand(client, values);
    default:
      throw new UsageError(command ? `unknown command ${command}` : "no command");
  }
}

async function submitCommand(client: Client, values: Values): Promise<number> {
  const order: Order = {
    customer: values.customer,
    items: (values.item ?? ["tea:2:450", "scone:3:300"]).map(parseItem),
  };
  const { runId, created } = await client.submit(checkoutWorkflow, order, { key: values.key });
  if (values.json) {
    console.log(JSON.stringify({ runId, created }));
  } else {
    console.log(`${created ? "submitted" : "already submitted"} ${runId}`);
  }
  return values.wait ? waitCommand(client, runId, values) : 0;
}

async function waitCommand(client: Client, runId: string, values: Values): Promise<number> {
  let run: Run;
  try {
    run = await client.wait(runId, { timeoutMs: positive(values.timeout) * 1000 });
  } catch (error) {
    if (!(error instanceof WaitTimeout)) throw error;
    console.error(error.message);
    run = error.last;
    printRun(run, values.json);
    return 1;
  }
  printRun(run, values.json);
  return run.status === RunStatus.COMPLETED ? 0 : 1;
}

async function listCommand(client: Client, values: Values): Promise<number> {
  const statuses = (values.status ?? []).map((name) => {
    const status = parseRunStatus(name);
    if (status === undefined) throw new UsageError(`unknown run status ${name}`);
    return status;
  });
  const runs = await client.listRuns({
    workflow: values.workflow,
    statuses,
    limit: Math.ceil(positive(values.limit)),
  });
  if (values.json) {
    console.log(JSON.stringify(runs.map(runToJson)));
    return 0;
  }
  for (const run of runs) {
    const counts = Object.entries(run.stepCounts)
      .map(([status, n]) => `${status} ${n}`)
      .join(", ");
    console.log(`${run.runId}  ${run.workflow.padEnd(12)} ${runStatusName(run.status).padEnd(10)} ${counts}`);
  }
  return 0;
}

function printRun(run: Run, json: boolean): void {
  console.log(json ? JSON.stringify(runToJson(run)) : describeRun(run));
}

function positive(text: string): number {
  const n = Number(text);
  if (!Number.isFinite(n) || n <= 0) throw new UsageError(`not a positive number: ${text}`);
  return n;
}

/** The address the command talks to, for messages about the server. */
let address = defaultAddress();

/** A parseArgs error (unknown option, missing value): its code is a string. */
function isArgsError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" && code.startsWith("ERR_PARSE_ARGS");
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    if (error instanceof ConnectError) {
      // The server's answer: its status (NOT_FOUND, INVALID_ARGUMENT...) and message.
      const hint =
        error.code === Code.Unavailable
          ? ` (is a Cyclone server listening on ${address}? set --address or CYCLONE_ADDRESS)`
          : "";
      console.error(`cyclone-ts: ${Code[error.code]}: ${error.rawMessage}${hint}`);
    } else if (error instanceof UsageError || isArgsError(error)) {
      console.error(`cyclone-ts: ${(error as Error).message}\n${USAGE}`);
    } else {
      console.error(error);
    }
    process.exitCode = 2;
  },
);
