// A thin TypeScript layer over the generated Cyclone client: connect, submit a
// workflow, wait for a run, list runs. Everything else is the generated
// WorkflowService client, usable as it is.

import { fromJson, toJson, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampDate, ValueSchema } from "@bufbuild/protobuf/wkt";
import { createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import {
  RunSchema,
  RunStatus,
  StepStatus,
  WorkflowSchema,
  type Run,
} from "./gen/cyclone/v1/types_pb.js";
import { WorkflowService } from "./gen/cyclone/v1/workflow_service_pb.js";

export type WorkflowClient = Client<typeof WorkflowService>;
/** A workflow as a plain object: `{ name, nodes: [{ name, action, dependsOn, ... }] }`. */
export type WorkflowInit = MessageInitShape<typeof WorkflowSchema>;

export const DEFAULT_ADDRESS = "127.0.0.1:50051";

/** `$CYCLONE_ADDRESS`, else 127.0.0.1:50051. */
export function defaultAddress(): string {
  return process.env.CYCLONE_ADDRESS || DEFAULT_ADDRESS;
}

/** A WorkflowService client speaking gRPC (HTTP/2, plaintext) to host:port. */
export function connect(address: string = defaultAddress()): WorkflowClient {
  const transport = createGrpcTransport({ baseUrl: `http://${address}` });
  return createClient(WorkflowService, transport);
}

/**
 * Submits a run of `workflow` with `input` (any JSON); returns the run id. With a
 * `key`, at most one run exists per (workflow name, key): a repeated call returns the
 * first run's id with `created: false`.
 */
export async function submit(
  client: WorkflowClient,
  workflow: WorkflowInit,
  input: JsonValue,
  key?: string,
): Promise<{ runId: string; created: boolean }> {
  const request = { workflow, input: fromJson(ValueSchema, input) };
  if (key === undefined) {
    const { runId } = await client.submit(request);
    return { runId, created: true };
  }
  return client.submitOnce({ ...request, key });
}

/** Statuses after which a run does not move without an operator. */
const SETTLED = new Set([
  RunStatus.COMPLETED,
  RunStatus.FAILED,
  RunStatus.BLOCKED,
  RunStatus.CANCELLED,
]);

export class WaitTimeout extends Error {
  constructor(
    readonly runId: string,
    readonly last: Run,
  ) {
    super(`run ${runId} is still ${runStatusName(last.status)}`);
  }
}

/**
 * Polls GetRun until the run is settled (completed, failed, blocked or cancelled) and
 * returns it with its steps. The interval grows from 100 ms to `maxIntervalMs`;
 * WaitTimeout after `timeoutMs`.
 */
export async function waitForRun(
  client: WorkflowClient,
  runId: string,
  { timeoutMs = 60_000, maxIntervalMs = 1_000 } = {},
): Promise<Run> {
  const deadline = Date.now() + timeoutMs;
  let interval = 100;
  for (;;) {
    const { run } = await client.getRun({ runId });
    if (!run) throw new Error(`GetRun answered no run for ${runId}`);
    if (SETTLED.has(run.status)) return run;
    if (Date.now() + interval > deadline) throw new WaitTimeout(runId, run);
    await new Promise((resolve) => setTimeout(resolve, interval));
    interval = Math.min(interval * 2, maxIntervalMs);
  }
}

export interface RunFilter {
  workflow?: string;
  statuses?: RunStatus[];
  /** Most runs to return, across pages. */
  limit?: number;
}

/** Runs, newest first, following ListRuns' pages until `limit` runs or the last page. */
export async function listRuns(client: WorkflowClient, filter: RunFilter = {}): Promise<Run[]> {
  const limit = filter.limit ?? 50;
  const runs: Run[] = [];
  let pageToken = "";
  do {
    const page = await client.listRuns({
      workflow: filter.workflow ?? "",
      statuses: filter.statuses ?? [],
      pageSize: Math.min(limit - runs.length, 1000),
      pageToken,
    });
    runs.push(...page.runs);
    pageToken = page.nextPageToken;
  } while (pageToken && runs.length < limit);
  return runs.slice(0, limit);
}

/** "completed" for RunStatus.COMPLETED. */
export function runStatusName(status: RunStatus): string {
  return (RunStatus[status] ?? String(status)).toLowerCase();
}

/** "running" for StepStatus.RUNNING. */
export function stepStatusName(status: StepStatus): string {
  return (StepStatus[status] ?? String(status)).toLowerCase();
}

/** RunStatus.FAILED for "failed" (any case); undefined for an unknown name. */
export function parseRunStatus(name: string): RunStatus | undefined {
  const status = RunStatus[name.toUpperCase() as keyof typeof RunStatus];
  return status === undefined || status === RunStatus.UNSPECIFIED ? undefined : status;
}

/** The run in proto3 JSON, as grpcurl prints it. */
export function runToJson(run: Run): JsonValue {
  return toJson(RunSchema, run);
}

/** A run as a few lines of text: its status, then one line per step. */
export function describeRun(run: Run): string {
  const created = run.createdAt ? timestampDate(run.createdAt).toISOString() : "?";
  const lines = [
    `run ${run.runId}  workflow ${run.workflow}  ${runStatusName(run.status).toUpperCase()}  created ${created}`,
  ];
  if (run.error) lines.push(`  error: ${run.error.kind}: ${run.error.message}`);
  for (const step of run.steps) {
    const output = step.output ? `  -> ${JSON.stringify(toJson(ValueSchema, step.output))}` : "";
    lines.push(
      `  ${step.node.padEnd(16)} ${stepStatusName(step.status).padEnd(10)} attempt ${step.attempt}/${step.maxAttempts}${output}`,
    );
    const last = step.errors.at(-1);
    if (last && step.status !== StepStatus.COMPLETED) {
      lines.push(`    last error (attempt ${last.attempt}): ${last.type}: ${last.message}`);
    }
  }
  return lines.join("\n");
}
