// The TypeScript SDK's conformance worker: serves the actions of
// tests/conformance/README.md (conformance.task, conformance.ledger, conformance.body)
// until SIGTERM, then exits 0.
//
//   node dist/worker.js --address A --database-url URL --effects FILE
//        [--lease SECONDS] [--concurrency N]

import { closeSync, fsyncSync, openSync, writeSync } from "node:fs";
import { parseArgs } from "node:util";

import { Failure, Worker, type JsonValue, type StepContext } from "@cyclone-workflows/sdk";
import { completeWith, type ClientPool, type Queryable } from "@cyclone-workflows/sdk/pg";
import pg from "pg";

const LANG = "ts";
/** The exit status of a planned crash. */
const CRASHED = 3;
const LEDGER = "INSERT INTO conformance_ledger (run_id, node, entry, attempt) VALUES ($1, $2, $3, $4)";
const BODY = "conformance.body";

const { values } = parseArgs({
  options: {
    address: { type: "string" },
    "database-url": { type: "string" },
    effects: { type: "string" },
    lease: { type: "string", default: "5" },
    concurrency: { type: "string", default: "4" },
  },
});
const address = values.address;
const databaseUrl = values["database-url"];
const effectsPath = values.effects;
if (!address || !databaseUrl || !effectsPath) {
  console.error("usage: worker.js --address HOST:PORT --database-url URL --effects FILE [--lease S] [--concurrency N]");
  process.exit(2);
}

/** What a spec or an operation of a body says; every field optional. */
interface Spec {
  value?: JsonValue;
  fail_attempts?: number;
  unencodable_output?: boolean;
  big_output?: number;
  crash?: string;
  crash_attempts?: number[];
  entry?: string;
  hold_attempts?: number[];
  hold_seconds?: number;
  calls?: Operation[];
}

interface Operation {
  step?: string;
  result?: JsonValue;
  unsafe?: boolean;
  crash?: string;
  crash_attempts?: number[];
  sleep?: number;
  event?: string;
  timeout?: number;
  child?: Operation[];
}

/** The node and attempt an effect line is about. */
interface Where {
  runId: string;
  node: string;
  attempt: number;
}

/** Appends an effect line and puts it on disk before returning. */
function effect(where: Where, name: string, phase = "effect"): void {
  const line = { run_id: where.runId, node: where.node, attempt: where.attempt, name, phase, lang: LANG, time: Date.now() / 1000 };
  const fd = openSync(effectsPath as string, "a");
  try {
    writeSync(fd, JSON.stringify(line) + "\n");
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** Ends the process at once, as a kill would, after its crash line. */
function crash(where: Where, name: string): never {
  effect(where, name, "crash");
  process.exit(CRASHED);
}

function planned(spec: { crash?: string; crash_attempts?: number[] }, point: string, attempt: number): boolean {
  return spec.crash === point && (spec.crash_attempts ?? [1]).includes(attempt);
}

function crashIf(spec: { crash?: string; crash_attempts?: number[] }, point: string, where: Where, name: string): void {
  if (planned(spec, point, where.attempt)) crash(where, name);
}

const db = new pg.Pool({ connectionString: databaseUrl, max: 4 });

async function task(ctx: StepContext): Promise<JsonValue> {
  const spec = (ctx.input ?? {}) as Spec;
  effect(ctx, ctx.node);
  crashIf(spec, "after_effect", ctx, ctx.node);
  if (ctx.attempt <= (spec.fail_attempts ?? 0)) {
    throw new Failure(`planned failure ${ctx.attempt}`, { type: "PlannedFailure" });
  }
  if (spec.unencodable_output) {
    return { tags: 10n } as unknown as JsonValue; // a BigInt: JSON has none
  }
  if (spec.big_output !== undefined) return { text: "x".repeat(spec.big_output) };
  return { value: spec.value ?? null, attempt: ctx.attempt, upstream: Object.keys(ctx.upstream).sort() };
}

/**
 * The pool the ledger's completion transaction takes its client from: the client is
 * the pool's, except that its COMMIT, once it returned, crashes the process when the
 * spec plans a crash after the commit.
 */
function crashingAfterCommit(where: Where, entry: string): ClientPool {
  return {
    async connect() {
      const client = await db.connect();
      return {
        async query(text: string, params?: unknown[]) {
          const result = await client.query(text, params);
          if (text.trim().toUpperCase() === "COMMIT") crash(where, entry);
          return result;
        },
        release: (error?: Error | boolean) => client.release(error),
      };
    },
  };
}

async function ledger(ctx: StepContext): Promise<void> {
  const spec = (ctx.input ?? {}) as Spec;
  const entry = String(spec.entry);
  if ((spec.hold_attempts ?? []).includes(ctx.attempt)) {
    effect(ctx, entry, "holding");
    // Whatever happens meanwhile to the lease: the signal is not listened to.
    await new Promise((resolve) => setTimeout(resolve, (spec.hold_seconds ?? 1) * 1000));
    effect(ctx, entry, "held");
  }
  const pool = planned(spec, "after_commit", ctx.attempt) ? crashingAfterCommit(ctx, entry) : db;
  await completeWith(ctx, pool, async (client: Queryable) => {
    await client.query(LEDGER, [ctx.runId, ctx.node, entry, ctx.attempt]);
    effect(ctx, entry);
    crashIf(spec, "before_commit", ctx, entry);
    return { entry, attempt: ctx.attempt };
  });
}

/** A child's outcome as a body gets it: the output of its only node. */
function childOutput(outcome: JsonValue): JsonValue {
  const outputs = (outcome as { outputs?: Record<string, JsonValue> } | null)?.outputs;
  if (outputs === null || typeof outputs !== "object") return outcome;
  const nodes = Object.values(outputs);
  return nodes.length === 1 ? nodes[0] : outputs;
}

async function operation(ctx: StepContext, op: Operation): Promise<JsonValue> {
  if (op.step !== undefined) {
    const id = op.step;
    const name = op.unsafe ? "conformance.unsafe_effect" : "conformance.effect";
    const result = await ctx.step(
      name,
      () => {
        crashIf(op, "before_effect", ctx, id);
        effect(ctx, id);
        crashIf(op, "after_effect", ctx, id);
        return op.result ?? null;
      },
      // The only argument is the step id, as in every language: the same digest.
      { stepId: id, unsafe: op.unsafe ?? false, args: [id] },
    );
    crashIf(op, "after_call", ctx, id);
    return result;
  }
  if (op.sleep !== undefined) {
    await ctx.sleep(op.sleep * 1000);
    return null;
  }
  if (op.event !== undefined) {
    effect(ctx, op.event, "waiting");
    return ctx.waitForEvent(op.event, { timeoutMs: op.timeout === undefined ? undefined : op.timeout * 1000 });
  }
  if (op.child !== undefined) {
    const workflow = { name: BODY, nodes: [{ name: BODY, action: BODY }] };
    const child = await ctx.startChild(workflow, { calls: op.child });
    return childOutput(await child.result());
  }
  throw new Error(`unknown operation ${JSON.stringify(op)}`);
}

async function body(ctx: StepContext): Promise<JsonValue> {
  // A node of the scenario's workflow has its spec as its input; a child run, as the run's.
  const spec = (ctx.input ?? ctx.runInput ?? {}) as Spec;
  const results: JsonValue[] = [];
  for (const op of spec.calls ?? []) results.push(await operation(ctx, op));
  return { results };
}

async function main(): Promise<void> {
  const worker = new Worker({
    address,
    concurrency: Number(values.concurrency),
    leaseMs: Number(values.lease) * 1000,
    actions: { "conformance.task": task, "conformance.ledger": ledger, [BODY]: body },
  });
  await worker.run({ handleSignals: true });
  await db.end();
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    console.error("conformance worker failed:", error);
    process.exit(1);
  },
);
