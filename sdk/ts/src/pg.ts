// The completion transaction on node-postgres: a handler's writes to the Cyclone
// database and the step's completion (cyclone.step_complete) commit together, so the
// effect happens exactly once. And the same for one step call of a durable function
// (cyclone.step_call_record).

import { create } from "@bufbuild/protobuf";

import type { StepContext } from "./context.js";
import { errorRecord, LeaseLost, nonRetryable, outputTooLarge, StepResultTooLarge } from "./errors.js";
import { StepCallSchema, StepCallStatus, type StepCall } from "./gen/cyclone/v1/types_pb.js";
import type { JournalCall, StepOptions } from "./journal.js";
import { fromValue, NotJsonError, toValue, valueSize } from "./json.js";

/** SQLSTATEs of the Cyclone SQL functions. */
export const SQLSTATE_LEASE_LOST = "CY001";
export const SQLSTATE_UNKNOWN_STEP = "CY002";
/** A repeat: this token's completion (or this step call's record) already committed. */
export const SQLSTATE_ALREADY_COMPLETED = "CY005";

/** What these functions need of a node-postgres client (pg.PoolClient, pg.Client). */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: unknown[]; rowCount: number | null }>;
}

/** A pool to take a client from (pg.Pool). */
export interface ClientPool {
  connect(): Promise<Queryable & { release(error?: Error | boolean): void }>;
}

function sqlState(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}

async function rollback(client: Queryable): Promise<void> {
  try {
    await client.query("ROLLBACK");
  } catch {
    // the connection is gone: nothing was committed
  }
}

/**
 * Records the step's success inside the open transaction of `client` (after the
 * handler's writes) with cyclone.step_complete, then commits. CY001 (the lease was
 * lost) rolls everything back and throws LeaseLost: let it through, the worker drops
 * the step. CY005 (a repeat of a completion that committed) rolls back and returns:
 * the step is done. An output that is not JSON or over the payload limit rolls back
 * and throws a non-retryable Failure. The worker then reports nothing more.
 */
export async function completeInTx(ctx: StepContext, client: Queryable, output: unknown): Promise<void> {
  let text: string;
  try {
    const value = toValue(output);
    const size = valueSize(value);
    if (size > ctx.journal.maxPayloadBytes) throw outputTooLarge(size, ctx.journal.maxPayloadBytes);
    text = JSON.stringify(fromValue(value));
  } catch (error) {
    await rollback(client);
    if (error instanceof NotJsonError) throw nonRetryable("OutputNotJson", `the handler's output is not JSON: ${error.message}`);
    throw error;
  }
  await ctx.flushLogs?.();
  try {
    await client.query("SELECT run_status FROM cyclone.step_complete($1, $2, $3, $4::jsonb)", [ctx.runId, ctx.node, ctx.leaseToken, text]);
  } catch (error) {
    await rollback(client);
    const state = sqlState(error);
    if (state === SQLSTATE_LEASE_LOST) throw new LeaseLost(`lease lost: ${(error as Error).message}`);
    if (state === SQLSTATE_ALREADY_COMPLETED) {
      ctx.completedInTx = true;
      return;
    }
    throw new Error(`cyclone.step_complete: ${(error as Error).message}`, { cause: error });
  }
  try {
    await client.query("COMMIT");
  } catch (error) {
    throw new Error(`commit of the completion transaction: ${(error as Error).message}`, { cause: error });
  }
  ctx.completedInTx = true;
}

/**
 * The handler's writes and its completion in one transaction: takes a client from
 * `pool`, BEGIN, runs `fn(client)` (your writes), then completeInTx with what it
 * returned. A throw of `fn` rolls back and is the step's failure, reported as usual.
 */
export async function completeWith(ctx: StepContext, pool: ClientPool, fn: (client: Queryable) => Promise<unknown>): Promise<void> {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    let output: unknown;
    try {
      output = await fn(client);
    } catch (error) {
      await rollback(client);
      throw error;
    }
    await completeInTx(ctx, client, output);
  } finally {
    client.release();
  }
}

/**
 * A step call of a durable function whose effect is a write to the Cyclone database:
 * `fn` writes with `client` inside a transaction, the call's success is recorded in
 * the same transaction (cyclone.step_call_record), and it commits. The write and the
 * record commit together or not at all. A failure of `fn` rolls back and is recorded
 * with EndStepCall, as a step's failure is. On replay the recorded outcome is
 * answered and `fn` does not run.
 */
export async function stepInTx<T>(
  ctx: StepContext,
  pool: ClientPool,
  name: string,
  fn: (client: Queryable) => Promise<T>,
  options: StepOptions = {},
): Promise<T> {
  const journal = ctx.journal;
  const call = await journal.begin(name, options);
  const entry = call.recorded ?? (await recordInTx(ctx, pool, call, fn));
  await journal.updatesPoint(); // a journal point: the updates delivered meanwhile apply here
  return journal.replay(entry) as T;
}

/** Runs a step call's `fn` in a transaction that records its success; the entry as recorded. */
async function recordInTx(ctx: StepContext, pool: ClientPool, call: JournalCall, fn: (client: Queryable) => Promise<unknown>): Promise<StepCall> {
  const journal = ctx.journal;
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    let output: unknown;
    try {
      output = await fn(client);
    } catch (error) {
      await rollback(client);
      if (ctx.signal.aborted) throw error; // the node is stopping: record nothing
      return await journal.end(call, undefined, errorRecord(error));
    }
    let value;
    try {
      value = toValue(output);
    } catch (error) {
      await rollback(client);
      throw journal.stop(nonRetryable("StepCallError", `the return value of step call ${call.id} is not JSON: ${(error as Error).message}`));
    }
    const size = valueSize(value);
    if (size > journal.maxPayloadBytes) {
      await rollback(client); // its writes go with it
      const tooLarge = new StepResultTooLarge(call.id, call.fn, size, journal.maxPayloadBytes);
      return await journal.end(call, undefined, errorRecord(tooLarge));
    }
    const { runId, node, leaseToken } = journal.ids;
    try {
      await client.query("SELECT cyclone.step_call_record($1, $2, $3, $4, $5, $6, $7::jsonb, $8)", [
        runId,
        node,
        leaseToken,
        call.id,
        call.seq,
        call.fn,
        JSON.stringify(fromValue(value)),
        call.digest || null,
      ]);
    } catch (error) {
      await rollback(client);
      const state = sqlState(error);
      if (state === SQLSTATE_LEASE_LOST) throw journal.stop(new LeaseLost(`lease lost: ${(error as Error).message}`));
      if (state === SQLSTATE_ALREADY_COMPLETED) return await journal.recordedElsewhere(call);
      throw new Error(`cyclone.step_call_record: ${(error as Error).message}`, { cause: error });
    }
    await client.query("COMMIT");
    const entry = create(StepCallSchema, {
      stepId: call.id,
      seq: call.seq,
      function: call.fn,
      unsafeToRepeat: call.unsafe,
      status: StepCallStatus.SUCCEEDED,
      output: value,
      attempt: journal.ids.attempt,
      argsDigest: call.digest,
    });
    return journal.remember(entry);
  } finally {
    client.release();
  }
}
