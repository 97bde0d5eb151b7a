// Talking to running work from a client: a run's output streams (docs/streams.md), the
// queries and updates of durable functions (docs/durable-functions.md, "Queries and
// updates"), and the approvals they ask for. Mixed into Client (client.ts).

import { create, type JsonValue } from "@bufbuild/protobuf";
import { durationFromMs, ListValueSchema, timestampDate, type ListValue, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { Client as ServiceClient } from "@connectrpc/connect";

import type { AdminService, Approval as ApprovalMessage } from "./gen/cyclone/v1/admin_service_pb.js";
import type { ReadStreamResponse, WorkflowService } from "./gen/cyclone/v1/workflow_service_pb.js";
import { fromValue, NotJsonError, toValue } from "./json.js";

/** The server's default waits of QueryRun and UpdateRun, in ms. */
export const QUERY_TIMEOUT_MS = 10_000;
export const UPDATE_TIMEOUT_MS = 30_000;
/** What the call's own deadline adds to the wait the server is asked for. */
const CALL_SLACK_MS = 10_000;

/** One chunk of an output stream. */
export interface StreamChunk {
  /** Its place in the stream: 0 for the first. */
  offset: number;
  /** The node that emitted it. */
  node: string;
  /** The step call it was emitted in; "" for the body itself. */
  stepId: string;
  /** The node's attempt that stored it. */
  attempt: number;
  emittedAt: Date | undefined;
  /** "text" for a string chunk, "json" for any other JSON value. */
  kind: "text" | "json";
  /** The chunk: the string of a text chunk, the value of a JSON one. */
  value: JsonValue;
}

/** One output stream of a run. */
export interface StreamSummary {
  name: string;
  /** How many chunks it holds (the next chunk's offset). */
  chunks: number;
  /** The bytes of its chunks' data. */
  bytes: number;
  lastEmittedAt: Date | undefined;
}

/** A query's answer. */
export interface QueryAnswer {
  /** The handler's value. */
  result: JsonValue;
  /** True when no worker ran the body: `result` is the value it last published (at `publishedAt`). */
  published: boolean;
  publishedAt: Date | undefined;
}

/** An update's outcome. */
export interface UpdateResult {
  /** The update handler's return value. */
  result: JsonValue;
  /** The update's id: the one given, or the one the server made. */
  updateId: string;
  /** False when `updateId` named an update sent before: this call sent nothing. */
  created: boolean;
  /** The journal position where the body applied it. */
  seq: number;
}

/** An approval a durable function asked for. */
export interface ApprovalInfo {
  approvalId: string;
  runId: string;
  node: string;
  workflow: string;
  /** The approval call's step id in the node's journal. */
  stepId: string;
  title: string;
  createdAt: Date | undefined;
  expiresAt: Date | undefined;
  /** Unset while pending. */
  decidedAt: Date | undefined;
  /** "callback" for its URL, or the actor of DecideApproval. */
  decidedBy: string;
  /** The payload the body got (null while pending). */
  decision: JsonValue;
}

export interface ReadStreamOptions {
  /** The offset of the first chunk (default 0). */
  fromOffset?: number;
  /** Stop once the chunks stored now were read, instead of following the stream until the run is finished. */
  noWait?: boolean;
  /** Aborts the read (the iteration then throws the abort's reason). */
  signal?: AbortSignal;
}

function date(at: Timestamp | undefined): Date | undefined {
  return at ? timestampDate(at) : undefined;
}

/** Positional arguments as a ListValue; an error names the one JSON cannot carry. */
function argList(args: readonly unknown[]): ListValue {
  return create(ListValueSchema, {
    values: args.map((arg, i) => {
      try {
        return toValue(arg);
      } catch (error) {
        if (error instanceof NotJsonError) throw new NotJsonError(`argument ${i + 1} ${error.path}`, error.reason);
        throw error;
      }
    }),
  });
}

function chunkOf(message: ReadStreamResponse): StreamChunk {
  const common = {
    offset: Number(message.offset),
    node: message.node,
    stepId: message.stepId,
    attempt: message.attempt,
    emittedAt: date(message.emittedAt),
  };
  if (message.data.case === "json") return { ...common, kind: "json", value: JSON.parse(message.data.value) as JsonValue };
  return { ...common, kind: "text", value: message.data.value ?? "" };
}

export function approvalInfo(a: ApprovalMessage): ApprovalInfo {
  return {
    approvalId: a.approvalId,
    runId: a.runId,
    node: a.node,
    workflow: a.workflow,
    stepId: a.stepId,
    title: a.title,
    createdAt: date(a.createdAt),
    expiresAt: date(a.expiresAt),
    decidedAt: date(a.decidedAt),
    decidedBy: a.decidedBy,
    decision: fromValue(a.decision),
  };
}

/** The client's calls to running work; Client extends it. */
export class RunMessages {
  constructor(
    readonly workflows: ServiceClient<typeof WorkflowService>,
    readonly admin: ServiceClient<typeof AdminService>,
  ) {}

  /**
   * The chunks of the run's output stream `stream`, in order, from `fromOffset`: those
   * stored, then each new one as it is stored, until the run is finished and every
   * chunk was read (with `noWait`, only those stored now). A stream nobody wrote is
   * empty. Breaking out of the loop ends the read.
   *
   *     for await (const chunk of client.readStream(runId, "tokens")) process.stdout.write(String(chunk.value));
   *
   * A ConnectError NotFound for an unknown run.
   */
  async *readStream(runId: string, stream: string, options: ReadStreamOptions = {}): AsyncGenerator<StreamChunk, void, undefined> {
    const responses = this.workflows.readStream(
      { runId, stream, fromOffset: BigInt(options.fromOffset ?? 0), noWait: options.noWait ?? false },
      { signal: options.signal },
    );
    for await (const message of responses) yield chunkOf(message);
  }

  /** The run's output streams, by name. A ConnectError NotFound for an unknown run. */
  async listStreams(runId: string): Promise<StreamSummary[]> {
    const { streams } = await this.workflows.listStreams({ runId });
    return streams.map((s) => ({ name: s.name, chunks: Number(s.chunks), bytes: Number(s.bytes), lastEmittedAt: date(s.lastEmittedAt) }));
  }

  /**
   * Asks the query handler `name` of the durable function running `node`
   * (ctx.query in its body) with JSON `args`: answered by the worker running the body,
   * or when none runs it from the value it last published (`published`). A
   * ConnectError: NotFound for an unknown run, node or handler; FailedPrecondition when
   * the handler threw (its type and message) or nothing can answer; DeadlineExceeded
   * when the worker did not answer within `timeoutMs` (default 10 s).
   */
  async query(runId: string, node: string, name: string, args: readonly unknown[] = [], options: { timeoutMs?: number } = {}): Promise<QueryAnswer> {
    const request = { runId, node, name, args: argList(args), timeout: options.timeoutMs === undefined ? undefined : durationFromMs(options.timeoutMs) };
    const response = await this.workflows.queryRun(request, { timeoutMs: (options.timeoutMs ?? QUERY_TIMEOUT_MS) + CALL_SLACK_MS });
    return { result: fromValue(response.result), published: response.published, publishedAt: date(response.publishedAt) };
  }

  /**
   * Sends the update `name` with JSON `args` to the durable function running `node`
   * and waits until its handler (ctx.update in the body) has applied it, recorded in
   * the node's journal: exactly once, across crashes. `updateId` is the idempotency
   * key (default: one the server makes): a repeat sends nothing and answers the first
   * update's outcome. A ConnectError: FailedPrecondition when the handler threw or the
   * run or node is finished; NotFound for an unknown run, node or handler;
   * AlreadyExists when `updateId` was used with another name or other args;
   * DeadlineExceeded when it was not applied within `timeoutMs` (default 30 s; it stays
   * recorded: call again with the same `updateId`).
   */
  async update(
    runId: string,
    node: string,
    name: string,
    args: readonly unknown[] = [],
    options: { updateId?: string; timeoutMs?: number } = {},
  ): Promise<UpdateResult> {
    const request = {
      runId,
      node,
      name,
      args: argList(args),
      updateId: options.updateId ?? "",
      timeout: options.timeoutMs === undefined ? undefined : durationFromMs(options.timeoutMs),
    };
    const response = await this.workflows.updateRun(request, { timeoutMs: (options.timeoutMs ?? UPDATE_TIMEOUT_MS) + CALL_SLACK_MS });
    return { result: fromValue(response.result), updateId: response.updateId, created: response.created, seq: response.seq };
  }

  /** Approvals, newest first: the pending ones, or with `all` every one; with `runId`, one run's. */
  async listApprovals(options: { runId?: string; all?: boolean; limit?: number } = {}): Promise<ApprovalInfo[]> {
    const { approvals } = await this.admin.listApprovals({ runId: options.runId ?? "", all: options.all ?? false, limit: options.limit ?? 0 });
    return approvals.map(approvalInfo);
  }

  /**
   * Decides a pending approval as its URL would: the waiting body gets
   * `{ approved, comment, decided_by }`. A ConnectError NotFound for an unknown
   * approval, FailedPrecondition when it is decided already, expired, or its run finished.
   */
  async decideApproval(approvalId: string, approved: boolean, comment = ""): Promise<ApprovalInfo> {
    const { approval } = await this.admin.decideApproval({ approvalId, approved, comment });
    if (!approval) throw new Error(`DecideApproval answered no approval for ${approvalId}`);
    return approvalInfo(approval);
  }
}
