// The replay engine of durable functions: a node's journal as this attempt knows it,
// and the rules of the journal protocol (docs/other-languages.md): each step call
// takes the next seq and a step id that come out the same at every replay; a call
// with an outcome in the journal is answered from it; a safe call without one runs
// and is ended with EndStepCall; an unsafe one is begun with BeginStepCall first, and
// one found STARTED makes the node uncertain (its run blocks for an operator).
//
// The engine talks to the server through a StepCallTransport: the generated
// WorkerService client in a worker, an in-memory journal in the testing helper.

import { create } from "@bufbuild/protobuf";
import { durationFromMs, timestampDate, timestampFromMs, type Value } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

import {
  StepCallStatus,
  type LogLine,
  type StepCall,
  type StepCallError,
  type Workflow,
} from "./gen/cyclone/v1/types_pb.js";
import { AsyncLocalStorage } from "node:async_hooks";

import {
  BeginStepCallRequestSchema,
  ChunkToEmitSchema,
  CreateApprovalRequestSchema,
  EmitChunksRequestSchema,
  EndStepCallRequestSchema,
  StartChildRequestSchema,
  StepCallDecision,
  WaitDecision,
  WaitRequestSchema,
  type BeginStepCallRequest,
  type BeginStepCallResponse,
  type CreateApprovalRequest,
  type CreateApprovalResponse,
  type EmitChunksRequest,
  type EmitChunksResponse,
  type EndStepCallRequest,
  type EndStepCallResponse,
  type StartChildRequest,
  type StartChildResponse,
  type WaitRequest,
  type WaitResponse,
} from "./gen/cyclone/v1/worker_service_pb.js";
import {
  badName,
  DEFAULT_MAX_PAYLOAD_BYTES,
  EffectUncertain,
  errorRecord,
  Failure,
  LeaseLost,
  MAX_NAME,
  MAX_STEP_CALLS,
  nonRetryable,
  OCCURRENCE_ROOM,
  recordedFailure,
  StepResultTooLarge,
  Suspended,
} from "./errors.js";
import { argsDigest } from "./digest.js";
import { BodyHandlers, UPDATE_FUNCTION, UPDATE_PREFIX } from "./handlers.js";
import {
  APPROVAL_BASE,
  APPROVAL_FUNCTION,
  APPROVAL_WAIT,
  approvalProblem,
  approvalWait,
  askedRecord,
  type Approval,
  type ApprovalOptions,
} from "./approvals.js";
import { fromValue, NotJsonError, toValue, valueSize, type JsonValue } from "./json.js";

/**
 * How long one durable call's RPC may take (each try, when UNAVAILABLE is retried): a
 * server that stopped answering without closing the connection fails the call with
 * DeadlineExceeded, and so the attempt, instead of holding the body until its node's
 * timeout.
 */
export const CALL_TIMEOUT_MS = 30_000;

/** What each call of a StepCallTransport is given. */
export interface CallOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
}

/** The four WorkerService calls a durable function makes; the generated client has them. */
export interface StepCallTransport {
  beginStepCall(request: BeginStepCallRequest, options?: CallOptions): Promise<BeginStepCallResponse>;
  endStepCall(request: EndStepCallRequest, options?: CallOptions): Promise<EndStepCallResponse>;
  wait(request: WaitRequest, options?: CallOptions): Promise<WaitResponse>;
  startChild(request: StartChildRequest, options?: CallOptions): Promise<StartChildResponse>;
  /** Output streams (ctx.emit); a transport without it cannot emit. */
  emitChunks?(request: EmitChunksRequest, options?: CallOptions): Promise<EmitChunksResponse>;
  /** Approvals (ctx.waitForApproval); a transport without it cannot ask for one. */
  createApproval?(request: CreateApprovalRequest, options?: CallOptions): Promise<CreateApprovalResponse>;
}

/** The step id of the step call whose function runs here (ctx.emit's chunks are its). */
const runningCall = new AsyncLocalStorage<string>();

/** The node a journal belongs to, and the lease its calls present. */
export interface NodeLease {
  runId: string;
  node: string;
  leaseToken: string;
  attempt: number;
}

export interface JournalLimits {
  /** The server's payload limit (--max-payload-bytes). */
  maxPayloadBytes: number;
  /** The most entries of a node's journal (at most 10,000). */
  maxStepCalls: number;
}

export const DEFAULT_LIMITS: JournalLimits = {
  maxPayloadBytes: DEFAULT_MAX_PAYLOAD_BYTES,
  maxStepCalls: MAX_STEP_CALLS,
};

export interface StepOptions {
  /**
   * The effect must never happen twice: the call is recorded STARTED before it runs,
   * and a replay that finds it STARTED blocks the run for an operator instead of
   * running it again.
   */
  unsafe?: boolean;
  /** The call's step id, instead of the step's name ("name", "name#2"...). */
  stepId?: string;
  /**
   * The arguments the call is made with (JSON values). Their digest is recorded with
   * the call, and a replay that makes the recorded call with other arguments fails
   * the node (ReplayMismatch) instead of answering it from the journal. The digest is
   * the Python SDK's for a function called with these positional arguments.
   */
  args?: readonly unknown[];
}

/** The functions the journal records for what is not a step of the body. */
export const PATCH_FUNCTION = "cyclone.patch";
const PATCH_PREFIX = "patch:";
const MAX_PATCH_ID = MAX_NAME - PATCH_PREFIX.length - 4; // 190
export const SLEEP_FUNCTION = "cyclone.sleep";
export const EVENT_FUNCTION = "cyclone.event";
export const START_CHILD_FUNCTION = "cyclone.start_child";
export const CHILD_FUNCTION = "cyclone.child";

/** A call of the body: its place, and what the journal says of it. */
interface Call {
  id: string;
  seq: number;
  fn: string;
  unsafe: boolean;
  /** The digest of the call's arguments; "" for none. */
  digest: string;
  /** The entry with an outcome; undefined when the call must run. */
  recorded: StepCall | undefined;
}

/** A step call's recorded outcome as the body gets it: the output, or the failure thrown. */
function replayed(entry: StepCall): JsonValue {
  if (entry.status === StepCallStatus.FAILED) throw recordedFailure(entry.error);
  return fromValue(entry.output);
}

function hasOutcome(entry: StepCall | undefined): entry is StepCall {
  return entry !== undefined && (entry.status === StepCallStatus.SUCCEEDED || entry.status === StepCallStatus.FAILED);
}

/** `recorded` names the function `now`: the same name, or a module-qualified form of it. */
function records(recorded: string, now: string): boolean {
  return recorded === now || recorded.endsWith("." + now);
}

/** Waits `ms`, or less when `signal` aborts first; never throws. */
export function sleepFor(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
  });
}

/** Calls `rpc` until it answers something else than UNAVAILABLE or `signal` aborts. */
export async function retryUnavailable<R>(rpc: () => Promise<R>, signal?: AbortSignal): Promise<R> {
  let delay = 0;
  for (;;) {
    try {
      return await rpc();
    } catch (error) {
      if (!(error instanceof ConnectError) || error.code !== Code.Unavailable || signal?.aborted) throw error;
      delay = Math.min(Math.max(2 * delay, 100), 5000);
      await sleepFor(delay, signal);
    }
  }
}

/**
 * The journal of one node attempt. Every durable call of the body goes through it, in
 * the body's order.
 */
export class Journal {
  private readonly byId = new Map<string, StepCall>();
  private readonly bySeq = new Map<number, StepCall>();
  private seq = 0;
  private readonly occurred = new Map<string, number>();
  private readonly used = new Set<string>();
  /** The chunks this attempt emitted, by stream and step call: their seqs. */
  private readonly emitted = new Map<string, number>();
  /** Why the body must stop; every later call throws it. */
  stopped: Error | undefined;
  /** The step's log lines not sent yet: a Wait carries them (a suspended node reports nothing). */
  takeLogs: (() => LogLine[]) | undefined;
  /** The query and update handlers the body registers (ctx.query, ctx.update). */
  readonly handlers = new BodyHandlers();
  /**
   * Set by the worker: fetches the updates sent to the node and hands them to
   * `handlers`, before a wait gives the node's lease back.
   */
  fetchUpdates: (() => Promise<void>) | undefined;
  /** Set by the worker: what the journal has to say that is not the body's failure. */
  warn: ((message: string) => void) | undefined;
  /** The highest seq of the journal this attempt was given: updates apply past it. */
  private readonly lastSeq: number;
  /** Whether that journal records applications of updates (a replay applies them again). */
  private readonly hasUpdates: boolean;
  private readonly signalOf: () => AbortSignal | undefined;

  private get signal(): AbortSignal | undefined {
    return this.signalOf();
  }

  /** The options of one try of a call's RPC. */
  private get callOptions(): CallOptions {
    return { signal: this.signal, timeoutMs: this.callTimeoutMs };
  }

  constructor(
    entries: readonly StepCall[],
    private readonly lease: NodeLease,
    private readonly transport: StepCallTransport,
    private readonly limits: JournalLimits = DEFAULT_LIMITS,
    /** Called once, when the body must stop: the worker aborts the handler's signal. */
    private readonly onStop: (reason: Error) => void = () => {},
    /**
     * Aborted when the node stops for another reason (lease lost, cancelled, deadline);
     * or a function that gives it, called only when a call needs it.
     */
    signal?: AbortSignal | (() => AbortSignal),
    private readonly callTimeoutMs: number = CALL_TIMEOUT_MS,
  ) {
    this.signalOf = typeof signal === "function" ? signal : () => signal;
    let lastSeq = 0;
    let hasUpdates = false;
    for (const entry of entries) {
      this.byId.set(entry.stepId, entry);
      this.bySeq.set(entry.seq, entry);
      lastSeq = Math.max(lastSeq, entry.seq);
      hasUpdates ||= entry.function === UPDATE_FUNCTION;
    }
    this.lastSeq = lastSeq;
    this.hasUpdates = hasUpdates;
  }

  /** The entries as this attempt knows them, in seq order. */
  entries(): StepCall[] {
    return [...this.bySeq.values()].sort((a, b) => a.seq - b.seq);
  }

  /**
   * Appends `chunk` to the run's output stream `stream` (docs/streams.md) and returns
   * its offset once it is stored. Identified by the step call it is emitted in (none
   * for the body) and its order there, so that a replay does not store it twice.
   */
  async emit(stream: string, chunk: unknown): Promise<number> {
    if (!stream) throw new Error("a stream's name is a non-empty string");
    const send = this.transport.emitChunks?.bind(this.transport);
    if (send === undefined) throw new Error("emit needs a server: this transport has no EmitChunks");
    const item = create(ChunkToEmitSchema, { stream, stepId: runningCall.getStore() ?? "" });
    if (typeof chunk === "string") {
      item.data = { case: "text", value: chunk };
    } else {
      const json = JSON.stringify(chunk);
      if (json === undefined) throw new TypeError("a stream chunk is a string or a JSON value");
      item.data = { case: "json", value: json };
    }
    const key = `${stream}\u0000${item.stepId}`;
    item.seq = (this.emitted.get(key) ?? 0) + 1;
    this.emitted.set(key, item.seq);
    const request = create(EmitChunksRequestSchema, { ...this.leaseIds(), chunks: [item] });
    try {
      const response = await retryUnavailable(() => send(request, this.callOptions), this.signal);
      return Number(response.offsets[0]);
    } catch (error) {
      if (error instanceof ConnectError) {
        if (error.code === Code.ResourceExhausted) throw nonRetryable("StreamFull", error.rawMessage);
        if (error.code === Code.Aborted) throw this.stop(new LeaseLost(`lease lost: ${error.rawMessage}`));
      }
      throw error;
    }
  }

  /** Stops the body: this and every later call throw `reason`. */
  stop(reason: Error): Error {
    if (this.stopped === undefined) {
      this.stopped = reason;
      this.onStop(reason);
    }
    return this.stopped;
  }

  /**
   * Runs `fn` as the step call `name`, or answers it from the journal. The value is
   * what `fn` returned, passed through JSON as a replay reads it back; a failure is a
   * Failure read from what was recorded, the same on the first run and on replays.
   */
  async step<T>(name: string, fn: (signal: AbortSignal) => T | Promise<T>, options: StepOptions = {}): Promise<T> {
    const call = await this.begin(name, options);
    const entry = call.recorded ?? (await this.run(call, fn));
    await this.updatesPoint();
    return replayed(entry) as T;
  }

  /** Runs the function of a call that has no outcome, and records the outcome; the entry as recorded. */
  private async run(call: Call, fn: (signal: AbortSignal) => unknown): Promise<StepCall> {
    const signal = this.signal ?? new AbortController().signal;
    let output: unknown;
    let failure: unknown;
    let failed = false;
    try {
      output = await runningCall.run(call.id, () => fn(signal));
    } catch (error) {
      failed = true;
      failure = error;
    }
    if (this.stopped) throw this.stopped;
    if (failed && signal.aborted) throw failure; // the node is stopping: record nothing
    let value: Value | undefined;
    if (!failed) {
      try {
        value = toValue(output);
      } catch (error) {
        const why = error instanceof NotJsonError ? error.message : String(error);
        throw this.stop(nonRetryable("StepCallError", `the return value of step call ${call.id} is not JSON: ${why}`));
      }
      const size = valueSize(value);
      if (size > this.limits.maxPayloadBytes) {
        failed = true;
        failure = new StepResultTooLarge(call.id, call.fn, size, this.limits.maxPayloadBytes);
        value = undefined;
      }
    }
    return this.end(call, value, failed ? errorRecord(failure) : undefined);
  }

  // -- updates: applied at journal points, recorded there ----------------------------

  /**
   * A journal point (a step call returns, a wait is reached): the updates the journal
   * records next are applied again (a replay); past the journal's end, the updates
   * delivered since the last point are applied and recorded, each an entry after the
   * call's (step id "update:<id>", function cyclone.update, its output the update's
   * name, args and result or error). Then the queries' values are published.
   */
  async updatesPoint(): Promise<void> {
    if (this.stopped) return;
    const handlers = this.handlers;
    if (!(this.hasUpdates || handlers.pending || handlers.queries.size > 0)) return;
    while (this.hasUpdates) {
      const entry = this.bySeq.get(this.seq + 1);
      if (entry === undefined || entry.function !== UPDATE_FUNCTION) break;
      this.seq++;
      this.used.add(entry.stepId);
      const problem = handlers.reapply(fromValue(entry.output));
      if (problem) this.warn?.(`journal entry ${entry.stepId}: ${problem}`);
    }
    if (handlers.pending && this.seq >= this.lastSeq) {
      for (const update of handlers.take()) {
        const stepId = UPDATE_PREFIX + update.updateId;
        if (this.byId.has(stepId) || this.used.has(stepId)) continue; // recorded already: applied (or refused) once
        let value: Value;
        try {
          value = toValue(handlers.apply(update));
        } catch (error) {
          value = toValue({ update: update.name, args: [], error: { type: "TypeError", message: String(error) } });
        }
        this.next(stepId);
        this.used.add(stepId);
        await this.end({ id: stepId, seq: this.seq, fn: UPDATE_FUNCTION, unsafe: false, digest: "", recorded: undefined }, value, undefined);
      }
    }
    handlers.publish();
  }

  /**
   * A wait is about to be asked (the node gives its lease back with it): the updates
   * sent to the node are fetched first, to be applied at this point, by a body that
   * takes updates.
   */
  private async fetchBeforeWait(entry: StepCall | undefined): Promise<void> {
    if (this.fetchUpdates && !hasOutcome(entry) && this.handlers.updates.size > 0) await this.fetchUpdates();
  }

  /**
   * Gives a call of the body its seq and step id, checks that the journal agrees, and
   * finds its outcome: from the journal, or for an unsafe call from BeginStepCall.
   */
  async begin(name: string, options: StepOptions = {}, base?: string, counted = true): Promise<Call> {
    const problem =
      badName("step name", name, MAX_NAME - OCCURRENCE_ROOM) ??
      (options.stepId === undefined ? undefined : badName("step id", options.stepId, MAX_NAME));
    if (problem) throw this.stop(nonRetryable("InvalidStepName", problem));
    const call = this.take(base ?? name, name, options, counted);
    if (call.recorded?.status === StepCallStatus.STARTED) {
      // Begun by an unsafe call with no outcome: only BeginStepCall decides whether it
      // runs again; a call the code no longer marks unsafe simply runs.
      call.recorded = undefined;
    }
    if (call.recorded && !hasOutcome(call.recorded)) call.recorded = undefined; // WAITING: not a step's
    if (call.recorded || !call.unsafe) return call;
    const response = await this.rpc("BeginStepCall", call, () =>
      this.transport.beginStepCall(this.beginRequest(call, true), this.callOptions),
    );
    switch (response.decision) {
      case StepCallDecision.RUN:
        return call;
      case StepCallDecision.RECORDED:
        call.recorded = response.call;
        if (response.call) this.remember(response.call);
        return call;
      case StepCallDecision.UNCERTAIN:
        throw this.stop(
          new EffectUncertain(
            `effect uncertain: step call ${call.id} was begun at attempt ${response.call?.attempt ?? "?"} and has no ` +
              `outcome; run ${this.lease.runId} is blocked until an operator resolves it ` +
              `(cyclone resolve ${this.lease.runId} ${call.id} --result/--error/--discard)`,
          ),
        );
      default:
        throw new Error(`BeginStepCall for ${call.id}: unknown decision ${response.decision}`);
    }
  }

  /** The next seq and step id, checked against the journal. */
  private take(base: string, fn: string, options: StepOptions, counted = true): Call {
    if (this.stopped) throw this.stopped;
    let id = options.stepId;
    if (id === undefined) {
      const n = (this.occurred.get(base) ?? 0) + 1;
      id = n > 1 ? `${base}#${n}` : base;
    }
    if (this.used.has(id)) {
      throw this.stop(
        nonRetryable(
          "DuplicateStepId",
          `step id ${id} is used twice in this durable function (by ${fn}); give one of the calls its own with { stepId }`,
        ),
      );
    }
    const digest = this.digest(id, fn, options.args);
    this.next(id);
    this.used.add(id);
    if (counted) this.occurred.set(base, (this.occurred.get(base) ?? 0) + 1);
    const call: Call = { id, seq: this.seq, fn, unsafe: options.unsafe ?? false, digest, recorded: this.byId.get(id) };
    const atSeq = this.bySeq.get(call.seq);
    const mismatch = this.mismatch(call, atSeq);
    if (mismatch) throw this.stop(mismatch);
    if (atSeq) call.fn = atSeq.function; // the journal's form of the name stands
    return call;
  }

  /** The digest of a call's arguments; "" when the call gives none. */
  private digest(id: string, fn: string, args: readonly unknown[] | undefined): string {
    if (args === undefined) return "";
    try {
      return argsDigest(args);
    } catch (error) {
      const why = error instanceof NotJsonError ? error.message : String(error);
      throw this.stop(
        nonRetryable("ArgumentsNotJson", `the arguments of step call ${id} (${fn}) are not JSON (${why}), so its replay cannot be checked`),
      );
    }
  }

  private next(id: string): void {
    const limit = Math.min(this.limits.maxStepCalls, MAX_STEP_CALLS);
    if (this.seq >= limit) {
      throw this.stop(
        nonRetryable(
          "JournalFull",
          `the durable function made more than ${limit} step calls, the most a node's journal holds (the call past ` +
            `it was ${id}); split the work into child runs, each with its own journal`,
        ),
      );
    }
    this.seq++;
  }

  private mismatch(call: Call, atSeq: StepCall | undefined): Failure | undefined {
    const now = `step "${call.id}" of ${call.fn}`;
    const other = this.byId.get(call.id);
    let problem: string | undefined;
    if (atSeq && atSeq.stepId !== call.id) {
      problem = `call #${call.seq} recorded step "${atSeq.stepId}" of ${atSeq.function}; this replay makes ${now} there`;
    } else if (!atSeq && other) {
      problem = `step "${other.stepId}" of ${other.function} was recorded as call #${other.seq}; this replay makes ${now} as call #${call.seq}`;
    } else if (atSeq && !records(atSeq.function, call.fn)) {
      problem = `call #${call.seq} recorded step "${atSeq.stepId}" of ${atSeq.function}; this replay makes ${now} there`;
    } else if (atSeq?.argsDigest && call.digest && atSeq.argsDigest !== call.digest) {
      problem = `${now} was recorded with other arguments (digest ${atSeq.argsDigest.slice(0, 12)}, now ${call.digest.slice(0, 12)}): its arguments changed`;
    }
    if (problem === undefined) return undefined;
    return nonRetryable(
      "ReplayMismatch",
      `the durable function does not replay its journal: ${problem}. The code changed under a run in flight, or ` +
        "the body depends on more than its input and its step results. Keep the step calls of runs in flight in " +
        "the same order (or let them finish before deploying), keep a renamed step's old name as its name, or put " +
        "the change behind ctx.patched()",
    );
  }

  /** Records the call's outcome with EndStepCall; the entry as recorded (the first outcome stands). */
  async end(call: Call, output: Value | undefined, error: StepCallError | undefined): Promise<StepCall> {
    const request = create(EndStepCallRequestSchema, {
      ...this.leaseIds(),
      stepId: call.id,
      seq: call.seq,
      function: call.fn,
      unsafeToRepeat: call.unsafe,
      argsDigest: call.digest,
      outcome: error ? { case: "error", value: error } : { case: "output", value: output ?? toValue(null) },
    });
    const response = await this.rpc("EndStepCall", call, () => this.transport.endStepCall(request, this.callOptions));
    const entry = response.call ?? {
      ...request,
      $typeName: "cyclone.v1.StepCall" as const,
      status: error ? StepCallStatus.FAILED : StepCallStatus.SUCCEEDED,
      output,
      error,
      attempt: this.lease.attempt,
      waitingFor: "",
    };
    return this.remember(entry as StepCall);
  }

  /** Keeps an entry recorded by this attempt. */
  remember(entry: StepCall): StepCall {
    this.byId.set(entry.stepId, entry);
    this.bySeq.set(entry.seq, entry);
    return entry;
  }

  /**
   * The recorded entry of a call that got its outcome elsewhere (its own transaction
   * raised CY005): a safe BeginStepCall, which writes nothing, reads it.
   */
  async recordedElsewhere(call: Call): Promise<StepCall> {
    const response = await this.rpc("BeginStepCall", call, () =>
      this.transport.beginStepCall(this.beginRequest(call, false), this.callOptions),
    );
    if (!response.call || !hasOutcome(response.call)) {
      throw new Error(`BeginStepCall for ${call.id}: the call was recorded in another transaction, and the server has no outcome of it`);
    }
    return this.remember(response.call);
  }

  /** The outcome of a recorded entry, as the body gets it. */
  replay(entry: StepCall): JsonValue {
    return replayed(entry);
  }

  /** The node's lease. */
  get ids(): NodeLease {
    return this.lease;
  }

  /** The payload limit a step result is held to. */
  get maxPayloadBytes(): number {
    return this.limits.maxPayloadBytes;
  }

  beginRequest(call: Call, unsafe: boolean): BeginStepCallRequest {
    return create(BeginStepCallRequestSchema, {
      ...this.leaseIds(),
      stepId: call.id,
      seq: call.seq,
      function: call.fn,
      unsafeToRepeat: unsafe,
      argsDigest: call.digest,
    });
  }

  private leaseIds(): { runId: string; node: string; leaseToken: string } {
    return { runId: this.lease.runId, node: this.lease.node, leaseToken: this.lease.leaseToken };
  }

  /**
   * A step call RPC, retried on UNAVAILABLE. A lost lease stops the node; a refused
   * request (a bug: bad values, too many calls) fails it for good.
   */
  private async rpc<R>(name: string, call: Call, send: () => Promise<R>): Promise<R> {
    try {
      return await retryUnavailable(send, this.signal);
    } catch (error) {
      if (this.stopped) throw this.stopped;
      if (error instanceof ConnectError) {
        if (error.code === Code.Aborted || error.code === Code.NotFound) {
          throw this.stop(new LeaseLost(`lease lost: ${error.rawMessage}`));
        }
        if (error.code === Code.InvalidArgument || error.code === Code.FailedPrecondition) {
          throw this.stop(nonRetryable("StepCallError", `${name} refused step call ${call.id}: ${error.rawMessage}`));
        }
        throw new Error(`${name} for step call ${call.id}: ${Code[error.code]}: ${error.rawMessage}`, { cause: error });
      }
      throw error;
    }
  }

  // -- patches ------------------------------------------------------------------

  /**
   * Whether the body takes the new path of patch `id`: true for a run that reaches it
   * first on code with the patch (the marker is recorded) or that recorded the marker
   * before; false for a run that went past this point on the code before the patch.
   */
  async patched(id: string): Promise<boolean> {
    const { seq, at } = this.openPatch(id);
    const stepId = PATCH_PREFIX + id;
    if (at || this.after(seq)) return at !== undefined;
    const elsewhere = this.byId.get(stepId);
    if (elsewhere) {
      throw this.stop(
        nonRetryable(
          "ReplayMismatch",
          `the durable function does not replay its journal: patch marker "${id}" was recorded as call ` +
            `#${elsewhere.seq}, and this replay reaches it as call #${seq}`,
        ),
      );
    }
    this.next(stepId);
    const call: Call = { id: stepId, seq, fn: PATCH_FUNCTION, unsafe: false, digest: "", recorded: undefined };
    await this.end(call, toValue(true), undefined);
    return true;
  }

  /** Where `patched(id)` was once no run takes the old path: replays the marker, records nothing. */
  deprecatePatch(id: string): void {
    this.openPatch(id);
  }

  private openPatch(id: string): { seq: number; at: StepCall | undefined } {
    const problem = badName("patch id", id, MAX_PATCH_ID);
    if (problem) throw this.stop(nonRetryable("InvalidPatchId", problem));
    if (this.stopped) throw this.stopped;
    const stepId = PATCH_PREFIX + id;
    if (this.used.has(stepId)) {
      throw this.stop(
        nonRetryable("DuplicateStepId", `patch "${id}" is used twice in this durable function; each patch id marks one place in the body`),
      );
    }
    this.used.add(stepId);
    const seq = this.seq + 1;
    const at = this.bySeq.get(seq);
    if (!at || at.stepId !== stepId) return { seq, at: undefined };
    if (at.function !== PATCH_FUNCTION) {
      throw this.stop(
        nonRetryable(
          "ReplayMismatch",
          `the durable function does not replay its journal: call #${seq} recorded step "${at.stepId}" of ` +
            `${at.function}; this replay makes patch marker "${id}" (${PATCH_FUNCTION}) there`,
        ),
      );
    }
    this.seq = seq;
    return { seq, at };
  }

  private after(seq: number): boolean {
    for (const s of this.bySeq.keys()) if (s >= seq) return true;
    return false;
  }

  // -- waits and children -----------------------------------------------------------

  /**
   * A wait of the journal: replayed when it has an outcome, else sent with Wait.
   * SUSPENDED stops the body: the node gave its lease back and is claimed again when
   * the wait is over.
   */
  async wait(
    base: string,
    fn: string,
    until: WaitRequest["until"],
    stepId: string | undefined,
    counted = true,
  ): Promise<JsonValue> {
    const call = this.take(base, fn, { stepId }, counted);
    // Updates apply before the wait is asked (the node holds its lease until then) or
    // its recorded outcome returns: a replay applies them at the same point.
    await this.fetchBeforeWait(call.recorded);
    await this.updatesPoint();
    if (this.stopped) throw this.stopped;
    if (hasOutcome(call.recorded)) return replayed(call.recorded);
    const request = create(WaitRequestSchema, {
      ...this.leaseIds(),
      stepId: call.id,
      seq: call.seq,
      until,
      logs: this.takeLogs?.() ?? [],
    });
    const response = await this.rpc("Wait", call, () => this.transport.wait(request, this.callOptions));
    if (response.decision === WaitDecision.READY && response.call) return replayed(this.remember(response.call));
    if (response.decision === WaitDecision.SUSPENDED) {
      throw this.stop(new Suspended(`waiting for ${response.call?.waitingFor || call.id}: the node gave its lease back`));
    }
    throw new Error(`Wait for ${call.id}: unknown decision ${response.decision}`);
  }

  /** A durable sleep until `wakeAtMs` (the first call's time stands at replays). */
  sleepUntil(wakeAtMs: number, stepId?: string): Promise<JsonValue> {
    return this.wait("sleep", SLEEP_FUNCTION, { case: "wakeAt", value: timestampFromMs(wakeAtMs) }, stepId);
  }

  /** Waits for the event `name` sent to the run; its payload. */
  waitForEvent(name: string, timeoutMs: number | undefined, stepId?: string): Promise<JsonValue> {
    const problem = badName("event name", name, MAX_NAME);
    if (problem) throw this.stop(nonRetryable("InvalidArgument", problem));
    const timeout =
      timeoutMs === undefined
        ? undefined
        : {
            $typeName: "google.protobuf.Duration" as const,
            seconds: BigInt(Math.floor(timeoutMs / 1000)),
            nanos: Math.round(timeoutMs % 1000) * 1e6,
          };
    return this.wait(`event:${name}`.slice(0, MAX_NAME - OCCURRENCE_ROOM), EVENT_FUNCTION, {
      case: "event",
      value: { $typeName: "cyclone.v1.EventWait", name, timeout },
    }, stepId);
  }

  /** Starts a child run once (StartChild is a call of the journal); its run id and step id. */
  async startChild(workflow: Workflow, input: unknown, stepId?: string): Promise<{ runId: string; stepId: string }> {
    const call = this.take("child", START_CHILD_FUNCTION, { stepId });
    if (hasOutcome(call.recorded)) {
      const output = replayed(call.recorded) as { run_id?: string };
      return { runId: String(output.run_id), stepId: call.id };
    }
    const request = create(StartChildRequestSchema, {
      ...this.leaseIds(),
      stepId: call.id,
      seq: call.seq,
      workflow,
      input: toValue(input),
    });
    const response = await this.rpc("StartChild", call, () => this.transport.startChild(request, this.callOptions));
    if (response.call) this.remember(response.call);
    return { runId: response.childRunId, stepId: call.id };
  }

  /**
   * Asks for an approval and waits for its decision without holding the node: the
   * approval call (step id "approval", "approval#2"... or `stepId`; function
   * cyclone.approval) creates the approval with CreateApproval and hands it to `send`,
   * once: a replay answers it from the journal, which records `{ approval_id, event,
   * expires_at }` and never the token. Then the wait "<id>.wait" (cyclone.event) for
   * the approval's event, until the token expires: the decision's payload, or a Failure
   * of type EventTimeout.
   */
  async waitForApproval(send: (approval: Approval) => unknown, options: ApprovalOptions = {}): Promise<JsonValue> {
    const { timeoutMs, title = "", stepId } = options;
    const problem = approvalProblem(send, options);
    if (problem) throw this.stop(nonRetryable("InvalidArgument", problem));
    const call = await this.begin(APPROVAL_FUNCTION, { stepId }, APPROVAL_BASE, stepId === undefined);
    const entry = call.recorded ?? (await this.run(call, () => this.ask(call.id, title, timeoutMs, send)));
    await this.updatesPoint();
    const asked = replayed(entry);
    const until = approvalWait(asked);
    if (until === undefined) {
      throw this.stop(nonRetryable("InvalidArgument", `the approval call ${call.id} is recorded as ${JSON.stringify(asked)}, not as an approval`));
    }
    const waitId = call.id + APPROVAL_WAIT;
    return this.wait(waitId, EVENT_FUNCTION, until, waitId, false);
  }

  /** The approval call's function: CreateApproval, then `send` unless it is decided already. */
  private async ask(stepId: string, title: string, timeoutMs: number | undefined, send: (approval: Approval) => unknown): Promise<JsonValue> {
    const create_ = this.transport.createApproval?.bind(this.transport);
    if (create_ === undefined) throw this.stop(nonRetryable("OutsideHandler", "waitForApproval needs a worker connected to a Cyclone server"));
    const request = create(CreateApprovalRequestSchema, {
      ...this.leaseIds(),
      stepId,
      title,
      timeout: timeoutMs === undefined ? undefined : durationFromMs(Math.round(timeoutMs)),
    });
    let reply: CreateApprovalResponse;
    try {
      reply = await retryUnavailable(() => create_(request, this.callOptions), this.signal);
    } catch (error) {
      if (error instanceof ConnectError && (error.code === Code.Aborted || error.code === Code.NotFound)) {
        throw this.stop(new LeaseLost(`lease lost: ${error.rawMessage}`));
      }
      throw error;
    }
    const expiresAt = reply.expiresAt ?? timestampFromMs(Date.now());
    if (!reply.decided) {
      await send({ approvalId: reply.approvalId, url: reply.url, token: reply.token, expiresAt: timestampDate(expiresAt) });
    }
    return askedRecord(reply.approvalId, reply.event, expiresAt);
  }

  /** Waits for a child run's outcome: `{ run_id, status, outputs }`, or a ChildFailed failure. */
  childResult(childRunId: string, startStepId: string): Promise<JsonValue> {
    return this.wait(`${startStepId}.result`, CHILD_FUNCTION, { case: "childRunId", value: childRunId }, `${startStepId}.result`);
  }
}

export type { Call as JournalCall };
