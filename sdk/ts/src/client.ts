// The client: submit workflows, wait for runs, send events, and the operator's
// calls (cancel, retry, resolve). Every RPC of the generated clients is there too, as
// `client.workflows` and `client.admin`.

import { fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import { timestampDate, ValueSchema } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";

import { AdminService } from "./gen/cyclone/v1/admin_service_pb.js";
import { RunSchema, RunStatus, StepStatus, type Run } from "./gen/cyclone/v1/types_pb.js";
import { WorkflowService } from "./gen/cyclone/v1/workflow_service_pb.js";
import { toPlainJson, toValue } from "./json.js";
import { RunMessages } from "./talk.js";
import { makeTransport, type ConnectOptions } from "./transport.js";
import { toWorkflowMessage, type WorkflowInit } from "./workflow.js";

/** Statuses after which a run does not move without an operator. */
const SETTLED = new Set([RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.BLOCKED, RunStatus.CANCELLED]);

/** A wait that gave up: the run is still not settled. */
export class WaitTimeout extends Error {
  override name = "WaitTimeout";
  constructor(
    readonly runId: string,
    readonly last: Run,
  ) {
    super(`run ${runId} is still ${runStatusName(last.status)}`);
  }
}

export interface RunFilter {
  workflow?: string;
  statuses?: RunStatus[];
  /** Most runs to return, across pages; default 50. */
  limit?: number;
}

/** How an operator resolves an uncertain step call: exactly one of the three. */
export type Resolution = { result: unknown } | { error: string } | { discard: true };

export class Client extends RunMessages {
  constructor(options: ConnectOptions = {}) {
    const transport = makeTransport(options);
    super(createClient(WorkflowService, transport), createClient(AdminService, transport));
  }

  /**
   * Submits a run of `workflow` with `input` (any JSON); its id. With `key`, at most one
   * run exists per (workflow name, key): a repeated call returns the first run's id
   * with `created: false`.
   */
  async submit(workflow: WorkflowInit, input: unknown = null, options: { key?: string } = {}): Promise<{ runId: string; created: boolean }> {
    const request = { workflow: toWorkflowMessage(workflow), input: toValue(input) };
    if (options.key === undefined) {
      const { runId } = await this.workflows.submit(request);
      return { runId, created: true };
    }
    const { runId, created } = await this.workflows.submitOnce({ ...request, key: options.key });
    return { runId, created };
  }

  /** The run with its steps (and with `logs`, their log lines). */
  async getRun(runId: string, options: { logs?: boolean } = {}): Promise<Run> {
    const { run } = await this.workflows.getRun({ runId, logs: options.logs ?? false });
    if (!run) throw new Error(`GetRun answered no run for ${runId}`);
    return run;
  }

  /**
   * Polls GetRun until the run is settled (completed, failed, blocked or cancelled),
   * from 100 ms up to `maxIntervalMs`; WaitTimeout after `timeoutMs`.
   */
  async wait(runId: string, { timeoutMs = 60_000, maxIntervalMs = 1_000 } = {}): Promise<Run> {
    const deadline = Date.now() + timeoutMs;
    let interval = 100;
    for (;;) {
      const run = await this.getRun(runId);
      if (SETTLED.has(run.status)) return run;
      if (Date.now() + interval > deadline) throw new WaitTimeout(runId, run);
      await new Promise((resolve) => setTimeout(resolve, interval));
      interval = Math.min(interval * 2, maxIntervalMs);
    }
  }

  /** Runs, newest first, following ListRuns' pages. */
  async listRuns(filter: RunFilter = {}): Promise<Run[]> {
    const limit = filter.limit ?? 50;
    const runs: Run[] = [];
    let pageToken = "";
    do {
      const page = await this.workflows.listRuns({
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

  /** Sends the event `name` to a run, for a durable function's waitForEvent. */
  async sendEvent(runId: string, name: string, payload: unknown = null, options: { key?: string } = {}): Promise<void> {
    await this.workflows.sendEvent({ runId, name, payload: toValue(payload), key: options.key ?? "" });
  }

  async cancel(runId: string, reason = ""): Promise<Run | undefined> {
    return (await this.workflows.cancelRun({ runId, reason })).run;
  }

  /** Retries a discarded node in place (AdminService.Retry). */
  async retry(runId: string, node: string, reason = ""): Promise<Run | undefined> {
    return (await this.admin.retry({ runId, node, reason })).run;
  }

  /**
   * Resolves a blocked run's uncertain step call (AdminService.Resolve): the call's
   * `result`, an `error` (the body's error handling runs), or `discard` (it runs again).
   */
  async resolve(runId: string, stepId: string, resolution: Resolution, options: { node?: string; reason?: string } = {}): Promise<Run | undefined> {
    const how =
      "result" in resolution
        ? { case: "result" as const, value: toValue(resolution.result) }
        : "error" in resolution
          ? { case: "error" as const, value: resolution.error }
          : { case: "discard" as const, value: true };
    const { run } = await this.admin.resolve({ runId, stepId, node: options.node ?? "", reason: options.reason ?? "", resolution: how });
    return run;
  }
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

/** A node's output as plain JSON. */
export function stepOutput(run: Run, node: string): JsonValue | undefined {
  const step = run.steps.find((s) => s.node === node);
  return step?.output ? toJson(ValueSchema, step.output) : undefined;
}

/** A run as a few lines of text: its status, then one line per step. */
export function describeRun(run: Run): string {
  const created = run.createdAt ? timestampDate(run.createdAt).toISOString() : "?";
  const lines = [`run ${run.runId}  workflow ${run.workflow}  ${runStatusName(run.status).toUpperCase()}  created ${created}`];
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

/** Plain JSON as a google.protobuf.Value (checked: an Error names what JSON cannot carry). */
export function jsonToValue(value: unknown) {
  return fromJson(ValueSchema, toPlainJson(value));
}
