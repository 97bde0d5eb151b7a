// What a handler sees of its step: ids, payloads, a signal that aborts when the step
// must stop, a logger whose lines travel with the step, and the durable calls of the
// journal (step, patched, sleep, waitForEvent, startChild).

import { create } from "@bufbuild/protobuf";
import { timestampFromDate, timestampMs } from "@bufbuild/protobuf/wkt";

import { LogLineSchema, StepStatus, type LogLine, type Workflow } from "./gen/cyclone/v1/types_pb.js";
import type { ClaimedStep } from "./gen/cyclone/v1/worker_service_pb.js";
import { clip, Failure } from "./errors.js";
import type { MessageHandler } from "./handlers.js";
import type { Approval, ApprovalOptions } from "./approvals.js";
import { Journal, type StepOptions } from "./journal.js";
import { fromValue, type JsonValue } from "./json.js";
import { toWorkflowMessage, type WorkflowInit } from "./workflow.js";

/** An upstream node that did not succeed, for a cleanup node (trigger rule all_done, one_failed). */
export interface UpstreamFailure {
  node: string;
  /** "discarded" (it failed for good) or "skipped" (it could never run). */
  status: string;
  error?: { type: string; message: string; details: string; attempt: number; kind: string };
}

/** Lines kept per attempt; the server keeps 1000 and marks the cut. */
const MAX_LOG_LINES = 1001;

/** A logger whose lines are stored with the step (cyclone logs RUN NODE). */
export interface StepLogger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

/** The lines a step logged and not yet sent. */
export class LogBuffer {
  private lines: LogLine[] = [];
  private count = 0;

  add(level: string, message: string, logger = ""): void {
    if (++this.count > MAX_LOG_LINES) return;
    this.lines.push(
      create(LogLineSchema, { level, message: clip(message, 4096), logger, at: timestampFromDate(new Date()) }),
    );
  }

  /** The lines to send; give them back with `restore` when the call failed. */
  take(): LogLine[] {
    const lines = this.lines;
    this.lines = [];
    return lines;
  }

  restore(lines: LogLine[]): void {
    this.lines = [...lines, ...this.lines];
  }
}

/** The handler's view of one claimed step. */
export class StepContext {
  readonly runId: string;
  readonly node: string;
  readonly action: string;
  readonly workflow: string;
  /** This claim's attempt (1 for the first); for logs, never for keys. */
  readonly attempt: number;
  readonly maxAttempts: number;
  /** The node's static input. */
  readonly input: JsonValue;
  /** The run's input. */
  readonly runInput: JsonValue;
  /** The outputs of the upstream nodes that completed, by node name. */
  readonly upstream: Readonly<Record<string, JsonValue>>;
  /** The upstream nodes that did not succeed (for cleanup nodes). */
  readonly upstreamFailures: readonly UpstreamFailure[];
  /** The progress an earlier attempt left with a heartbeat, or undefined. */
  readonly progress: JsonValue | undefined;
  /** An earlier attempt lost its lease with no outcome: its effect may have happened. */
  readonly effectUncertain: boolean;
  readonly leaseToken: string;
  /** The handler's deadline (the node's timeout, counted from this claim). */
  readonly deadline: Date;
  /**
   * The run's deadline (given to submit, or its workflow's default), or undefined when
   * the run has none. At it the run is cancelled and `signal` aborts; read it to budget work.
   */
  readonly runDeadline: Date | undefined;
  /**
   * Aborts when the step must stop: the lease is lost, the run cancelled, the deadline
   * passed, or the worker stops hard. `signal.reason` says which.
   */
  get signal(): AbortSignal {
    return this.signalOf();
  }
  private readonly signalOf: () => AbortSignal;
  readonly log: StepLogger;
  /** The journal of the node's durable calls. */
  readonly journal: Journal;

  /** Set once the completion committed in the handler's own transaction. */
  completedInTx = false;
  /** The progress to send with the next heartbeat. */
  pendingProgress: JsonValue | undefined;
  /**
   * Sends the log lines not sent yet, now (the worker's heartbeat). A completion in the
   * handler's own transaction calls it first: no Complete will carry them.
   */
  flushLogs: (() => Promise<void>) | undefined;

  constructor(
    readonly claimed: ClaimedStep,
    journal: Journal,
    /** The signal, or a function that gives it (called when the signal is first asked for). */
    signal: AbortSignal | (() => AbortSignal),
    readonly logs: LogBuffer = new LogBuffer(),
  ) {
    this.runId = claimed.runId;
    this.node = claimed.node;
    this.action = claimed.action;
    this.workflow = claimed.workflow;
    this.attempt = claimed.attempt;
    this.maxAttempts = claimed.maxAttempts;
    this.input = fromValue(claimed.input);
    this.runInput = fromValue(claimed.runInput);
    this.upstream = Object.fromEntries(Object.entries(claimed.upstreamOutputs).map(([k, v]) => [k, fromValue(v)]));
    this.upstreamFailures = claimed.upstreamFailures.map((f) => ({
      node: f.node,
      status: (StepStatus[f.status] ?? String(f.status)).toLowerCase(),
      error: f.error && {
        type: f.error.type,
        message: f.error.message,
        details: f.error.details,
        attempt: f.error.attempt,
        kind: f.error.kind,
      },
    }));
    this.progress = claimed.progress === undefined ? undefined : fromValue(claimed.progress);
    this.effectUncertain = claimed.effectUncertain;
    this.leaseToken = claimed.leaseToken;
    this.deadline = claimed.deadline ? new Date(timestampMs(claimed.deadline)) : new Date(Date.now() + 3600_000);
    this.runDeadline = claimed.runDeadline ? new Date(timestampMs(claimed.runDeadline)) : undefined;
    this.signalOf = typeof signal === "function" ? signal : () => signal;
    this.journal = journal;
    journal.takeLogs = () => logs.take();
    const line = (level: string) => (message: string) => logs.add(level, message);
    this.log = { debug: line("DEBUG"), info: line("INFO"), warn: line("WARNING"), error: line("ERROR") };
  }

  /** The clock sleeps are counted from, in ms. */
  protected now(): number {
    return Date.now();
  }

  /** "run_id:node": the same on every attempt, the idempotency key of the step's effects. */
  get key(): string {
    return `${this.runId}:${this.node}`;
  }

  /** The output of upstream node `node`; an Error when it has none. */
  upstreamOutput(node: string): JsonValue {
    if (!(node in this.upstream)) throw new Error(`no output of upstream node "${node}" (upstream: ${Object.keys(this.upstream).join(", ") || "none"})`);
    return this.upstream[node];
  }

  /** Progress (small JSON) sent with the next heartbeat and handed to a later attempt. */
  setProgress(value: JsonValue): void {
    this.pendingProgress = value;
  }

  // -- durable functions ----------------------------------------------------------

  /**
   * Runs `fn` as a step call of the node's journal, or replays its recorded outcome.
   * `name` is recorded as the function and is the base of the step ids of its calls
   * ("charge", "charge#2"...). The value comes back through JSON, as a replay reads
   * it; a failure comes back as a Failure with the recorded type and message.
   */
  step<T>(name: string, fn: (signal: AbortSignal) => T | Promise<T>, options?: StepOptions): Promise<T> {
    return this.journal.step(name, fn, options);
  }

  /** `step` with `unsafe: true`: never run twice without an operator. */
  unsafeStep<T>(name: string, fn: (signal: AbortSignal) => T | Promise<T>, options?: Omit<StepOptions, "unsafe">): Promise<T> {
    return this.journal.step(name, fn, { ...options, unsafe: true });
  }

  /**
   * Appends `chunk` (a string, or any JSON value) to the run's output stream `stream`
   * and returns its offset once it is stored (docs/streams.md). Inside a step call's
   * function the chunk belongs to that call: a replay that answers the call from the
   * journal does not store it again. Past the server's bounds it throws a
   * non-retryable Failure of type StreamFull.
   */
  emit(stream: string, chunk: unknown): Promise<number> {
    return this.journal.emit(stream, chunk);
  }

  /** Whether this run takes the new path of patch `id` (see durable functions, patches). */
  patched(id: string): Promise<boolean> {
    return this.journal.patched(id);
  }

  /** Where `patched(id)` stood once no run in flight takes the old path. */
  deprecatePatch(id: string): void {
    this.journal.deprecatePatch(id);
  }

  /** A durable sleep: the node gives its lease back and is claimed again when it is over. */
  async sleep(ms: number, options: { stepId?: string } = {}): Promise<void> {
    await this.journal.sleepUntil(this.now() + ms, options.stepId);
  }

  /** A durable sleep until `when`. */
  async sleepUntil(when: Date, options: { stepId?: string } = {}): Promise<void> {
    await this.journal.sleepUntil(when.getTime(), options.stepId);
  }

  /**
   * Waits for the event `name` sent to this run (Client.sendEvent) and returns its
   * payload. With `timeoutMs`, a Failure of type EventTimeout when none came.
   */
  waitForEvent(name: string, options: { timeoutMs?: number; stepId?: string } = {}): Promise<JsonValue> {
    return this.journal.waitForEvent(name, options.timeoutMs, options.stepId);
  }

  /**
   * Asks a person for a decision through a one-time URL and waits for it without
   * holding a worker slot; returns the JSON the decision carried (`{ approved,
   * comment, decided_by }` from DecideApproval or the console, or whatever was POSTed
   * to the URL). `send(approval)` hands the URL out (a mail, a chat message): it runs
   * once, when the approval is created, as a step's function does; a replay neither
   * creates the approval nor sends it again. With no decision before the token expires
   * (`timeoutMs`, default the server's --approval-timeout), a Failure of type
   * EventTimeout. Step ids "approval", "approval#2"... (its wait "approval.wait")
   * unless `stepId` names it. Needs a server with an HTTP listener (--http-listen).
   */
  waitForApproval(send: (approval: Approval) => unknown, options: ApprovalOptions = {}): Promise<JsonValue> {
    return this.journal.waitForApproval(send, options);
  }

  /**
   * Registers the query handler `name`: a client's query (Client.query) is answered
   * with its return value, at once, by the worker running the body; it reads the
   * body's state and must answer synchronously. A handler that takes no arguments has
   * its value published at the body's journal points (when it changed) and when the
   * body ends, for queries asked while no worker runs the body.
   */
  query(name: string, fn: MessageHandler): void {
    this.journal.handlers.query(name, fn);
  }

  /**
   * Registers the update handler `name` (a plain function, not async): an update sent
   * to the body (Client.update) runs it at the body's next journal point (a step call
   * returning, a wait), recorded in the journal with its arguments and result, and its
   * return value is the sender's result; a throw is the sender's FailedPrecondition. A
   * replay runs it again with the recorded arguments at the same point.
   */
  update(name: string, fn: MessageHandler): void {
    this.journal.handlers.update(name, fn);
  }

  /** Starts a child run, once: a replay gets the same child back. */
  async startChild(workflow: WorkflowInit | Workflow, input: unknown = null, options: { stepId?: string } = {}): Promise<ChildRun> {
    const started = await this.journal.startChild(toWorkflowMessage(workflow), input, options.stepId);
    return new ChildRun(this.journal, started.runId, started.stepId);
  }
}

/** A child run started by a durable function. */
export class ChildRun {
  constructor(
    private readonly journal: Journal,
    readonly runId: string,
    readonly stepId: string,
  ) {}

  /**
   * Waits (without a slot) for the child's outcome: `{ run_id, status, outputs }`, or a
   * Failure of type ChildFailed or ChildCancelled.
   */
  result(): Promise<JsonValue> {
    return this.journal.childResult(this.runId, this.stepId);
  }
}

export { Failure };
