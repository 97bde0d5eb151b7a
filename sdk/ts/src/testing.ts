// Testing durable functions without a server: DurableNode runs a body on the real
// replay engine over a journal kept in memory, with the server's rules for it (begin,
// end, uncertain unsafe calls, waits, the trailing-failure rule), and lets a test
// crash the worker right after a step function ran and before its outcome was
// recorded, then run the node again as the next attempt would. explore() tries every
// such crash point of a body.
//
//   const node = new DurableNode(fulfil, { runInput: { order_id: "o-1", amount: 42 } });
//   assert.equal((await node.run({ crashAfter: "charge_card" })).status, "crashed");
//   assert.equal((await node.run()).blockedOn, "charge_card");   // unsafe: blocks
//   node.resolve("charge_card", { result: { charge_id: "ch_1" } });
//   assert.equal((await node.run()).status, "completed");
//   assert.deepEqual(node.executions, { price_order: 1, charge_card: 1, ... });

import { create } from "@bufbuild/protobuf";
import { timestampFromMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

import { LogBuffer, StepContext } from "./context.js";
import { EffectUncertain, Failure, NodeStopped, Suspended } from "./errors.js";
import { StepCallErrorSchema, StepCallSchema, StepCallStatus, type StepCall } from "./gen/cyclone/v1/types_pb.js";
import {
  BeginStepCallResponseSchema,
  ClaimedStepSchema,
  CreateApprovalResponseSchema,
  EmitChunksResponseSchema,
  EndStepCallResponseSchema,
  StartChildResponseSchema,
  StepCallDecision,
  WaitDecision,
  WaitResponseSchema,
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
import { UPDATE_PREFIX, type BodyHandlers, type DeliveredUpdate, type HandlerError } from "./handlers.js";
import { DEFAULT_LIMITS, Journal, type JournalLimits, type StepCallTransport, type StepOptions } from "./journal.js";
import { fromValue, toValue, valueSize, type JsonValue } from "./json.js";
import type { Handler } from "./worker.js";

/** The worker died: a step function ran and its outcome was not recorded. */
export class SimulatedCrash extends NodeStopped {
  override name = "SimulatedCrash";
}

export interface NodeOptions {
  input?: JsonValue;
  runInput?: JsonValue;
  upstream?: Record<string, JsonValue>;
  runId?: string;
  node?: string;
  limits?: Partial<JournalLimits>;
}

export interface RunOptions {
  /** Crash right after this step id's function ran, before its outcome is recorded. */
  crashAfter?: string;
}

export interface AttemptResult {
  attempt: number;
  status: "completed" | "failed" | "crashed" | "blocked" | "suspended";
  output?: JsonValue;
  /** The body's failure, for status "failed". */
  failure?: Error;
  /** The unsafe step id the run is blocked on, for status "blocked". */
  blockedOn?: string;
  /** What the body waits for, for status "suspended". */
  waitingFor?: string;
}

type Resolution = { result: unknown } | { error: string } | { discard: true };

/** A step context whose step calls count how often each function really ran. */
class CountingContext extends StepContext {
  constructor(
    private readonly counts: Record<string, number>,
    private readonly clock: () => number,
    ...args: ConstructorParameters<typeof StepContext>
  ) {
    super(...args);
  }

  protected override now(): number {
    return this.clock();
  }

  override step<T>(name: string, fn: (signal: AbortSignal) => T | Promise<T>, options?: StepOptions): Promise<T> {
    return super.step(
      name,
      (signal) => {
        this.counts[name] = (this.counts[name] ?? 0) + 1;
        return fn(signal);
      },
      options,
    );
  }

  override unsafeStep<T>(name: string, fn: (signal: AbortSignal) => T | Promise<T>, options?: Omit<StepOptions, "unsafe">): Promise<T> {
    return this.step(name, fn, { ...options, unsafe: true });
  }
}

/** One node of a durable function, on a journal in memory. */
export class DurableNode implements StepCallTransport {
  /** The node's journal, by seq. */
  readonly journal = new Map<number, StepCall>();
  /** How many times each step function really ran, by step name. */
  readonly executions: Record<string, number> = {};
  /** The attempts run so far. */
  readonly attempts: AttemptResult[] = [];
  /** The fake clock of sleeps and event timeouts, in ms. */
  now = Date.UTC(2026, 0, 1);
  /**
   * What the body emitted (ctx.emit), by stream, as the server stores it: a chunk that
   * a replay emits again is there once.
   */
  readonly streams: Record<string, JsonValue[]> = {};
  private readonly chunkOffsets = new Map<string, number>();
  /** Child runs started, by run id. */
  readonly children = new Map<string, { workflow: string; input: JsonValue; result?: JsonValue; failed?: string }>();

  /**
   * The approvals the body asked for (ctx.waitForApproval), by the approval call's step
   * id: its id, title, the token given out last and how many were (a repeat of the call
   * keeps the id and issues a new token). Decide one with `sendEvent(approval.event, decision)`.
   */
  readonly approvals = new Map<string, { approvalId: string; event: string; title: string; token: string; tokens: number }>();

  private readonly events: { name: string; payload: JsonValue }[] = [];
  /** The updates sent to the node (sendUpdate): each attempt gets those its journal does not record. */
  private readonly updates: DeliveredUpdate[] = [];
  /** The handlers the last attempt's body registered. */
  private handlers: BodyHandlers | undefined;
  private attempt = 0;
  private crashAfter: string | undefined;
  private crashed = false;
  private blockedOn: string | undefined;
  private readonly limits: JournalLimits;

  constructor(
    private readonly body: Handler,
    private readonly options: NodeOptions = {},
  ) {
    this.limits = { ...DEFAULT_LIMITS, ...options.limits };
  }

  /** The journal's entries in seq order. */
  entries(): StepCall[] {
    return [...this.journal.values()].sort((a, b) => a.seq - b.seq);
  }

  /** The entry of a step id, or undefined. */
  entry(stepId: string): StepCall | undefined {
    return this.entries().find((e) => e.stepId === stepId);
  }

  /** Runs the node's next attempt: the body from the top, replaying the journal. */
  async run(options: RunOptions = {}): Promise<AttemptResult> {
    if (this.blockedOn) {
      const result: AttemptResult = { attempt: this.attempt, status: "blocked", blockedOn: this.blockedOn };
      this.attempts.push(result);
      return result;
    }
    this.attempt++;
    this.crashAfter = options.crashAfter;
    this.crashed = false;
    const controller = new AbortController();
    const lease = { runId: this.options.runId ?? "00000000-0000-7000-8000-000000000001", node: this.options.node ?? "node", leaseToken: `lease-${this.attempt}`, attempt: this.attempt };
    const journal = new Journal(this.entries(), lease, this, this.limits, (reason) => controller.abort(reason), controller.signal);
    for (const update of this.updates) {
      if (!this.entry(UPDATE_PREFIX + update.updateId)) journal.handlers.deliver(update);
    }
    this.handlers = journal.handlers;
    const claimed = create(ClaimedStepSchema, {
      runId: lease.runId,
      node: lease.node,
      action: "test",
      workflow: "test",
      attempt: this.attempt,
      maxAttempts: 100,
      input: toValue(this.options.input ?? null),
      runInput: toValue(this.options.runInput ?? null),
      upstreamOutputs: Object.fromEntries(Object.entries(this.options.upstream ?? {}).map(([k, v]) => [k, toValue(v)])),
      leaseToken: lease.leaseToken,
      journal: this.entries(),
    });
    const ctx = new CountingContext(this.executions, () => this.now, claimed, journal, controller.signal, new LogBuffer());
    let result: AttemptResult;
    try {
      const output = await this.body(ctx);
      result = this.outcome(journal.stopped, undefined, output);
    } catch (error) {
      result = this.outcome(journal.stopped, error, undefined);
    }
    if (result.status === "failed") this.dropTrailingFailures();
    this.attempts.push(result);
    return result;
  }

  private outcome(stopped: Error | undefined, error: unknown, output: unknown): AttemptResult {
    const attempt = this.attempt;
    if (this.crashed) return { attempt, status: "crashed" };
    const why = stopped ?? error;
    if (why instanceof EffectUncertain) return { attempt, status: "blocked", blockedOn: this.blockedOn };
    if (why instanceof Suspended) return { attempt, status: "suspended", waitingFor: why.message };
    if (why !== undefined) return { attempt, status: "failed", failure: why instanceof Error ? why : new Error(String(why)) };
    try {
      const value = toValue(output);
      if (valueSize(value) > this.limits.maxPayloadBytes) {
        return { attempt, status: "failed", failure: new Failure("the output is over the payload limit", { type: "OutputTooLarge", nonRetryable: true }) };
      }
      return { attempt, status: "completed", output: fromValue(value) };
    } catch (notJson) {
      return { attempt, status: "failed", failure: notJson as Error };
    }
  }

  /** The server's rule: a failed attempt's trailing safe FAILED entries are deleted. */
  private dropTrailingFailures(): void {
    for (;;) {
      const last = this.entries().at(-1);
      if (!last || last.status !== StepCallStatus.FAILED || last.unsafeToRepeat) return;
      this.journal.delete(last.seq);
    }
  }

  /** An operator's resolution of the uncertain call `stepId`; the run is unblocked. */
  resolve(stepId: string, resolution: Resolution): void {
    const entry = this.entry(stepId);
    if (!entry || entry.status !== StepCallStatus.STARTED) throw new Error(`step call ${stepId} is not uncertain`);
    if ("result" in resolution) {
      this.record(entry, StepCallStatus.SUCCEEDED, { output: toValue(resolution.result) });
    } else if ("error" in resolution) {
      this.record(entry, StepCallStatus.FAILED, { error: create(StepCallErrorSchema, { type: "EffectFailed", message: resolution.error }) });
    } else {
      this.journal.delete(entry.seq);
    }
    this.blockedOn = undefined;
  }

  /**
   * Sends an update to the body (as Client.update does): the next attempt's body
   * applies it at its first journal point and records it (see `updateOutcome`). Its id.
   */
  sendUpdate(name: string, args: JsonValue[] = [], options: { updateId?: string } = {}): string {
    const updateId = options.updateId ?? `update-${this.updates.length + 1}`;
    this.updates.push({ updateId, name, args });
    return updateId;
  }

  /** What the journal records of an update's application, or undefined while it is not applied. */
  updateOutcome(updateId: string): JsonValue | undefined {
    const entry = this.entry(UPDATE_PREFIX + updateId);
    return entry ? fromValue(entry.output) : undefined;
  }

  /** Asks the query handler `name` of the last attempt's body, as its worker would answer. */
  query(name: string, args: JsonValue[] = []): { value: JsonValue } | { error: HandlerError } {
    if (!this.handlers) throw new Error("the node has not run: no body registered a handler");
    return this.handlers.answer(name, args);
  }

  /** Sends an event to the run, for waitForEvent. */
  sendEvent(name: string, payload: JsonValue = null): void {
    this.events.push({ name, payload });
  }

  /** Moves the fake clock forward (sleeps end, event waits time out). */
  advance(ms: number): void {
    this.now += ms;
  }

  /** Finishes a child run: with `outputs` by node, or failed with a message. */
  finishChild(runId: string, outcome: { outputs: Record<string, JsonValue> } | { failed: string }): void {
    const child = this.children.get(runId);
    if (!child) throw new Error(`no child run ${runId}`);
    if ("failed" in outcome) child.failed = outcome.failed;
    else child.result = { run_id: runId, status: "completed", outputs: outcome.outputs };
  }

  private record(entry: StepCall, status: StepCallStatus, fields: Partial<Pick<StepCall, "output" | "error">>): StepCall {
    const updated = create(StepCallSchema, { ...entry, status, output: fields.output, error: fields.error, attempt: this.attempt });
    this.journal.set(updated.seq, updated);
    return updated;
  }

  private newEntry(
    request: { stepId: string; seq: number; function?: string; unsafeToRepeat?: boolean; argsDigest?: string },
    fn?: string,
  ): StepCall {
    return create(StepCallSchema, {
      stepId: request.stepId,
      seq: request.seq,
      function: fn ?? request.function ?? "",
      unsafeToRepeat: request.unsafeToRepeat ?? false,
      argsDigest: request.argsDigest ?? "",
      attempt: this.attempt,
      startedAt: timestampFromMs(this.now),
    });
  }

  private checkLease(token: string): void {
    if (token !== `lease-${this.attempt}`) throw new ConnectError("the lease is no longer held", Code.Aborted);
  }

  // -- StepCallTransport: the server's side ------------------------------------------

  async beginStepCall(request: BeginStepCallRequest): Promise<BeginStepCallResponse> {
    this.checkLease(request.leaseToken);
    const entry = this.entry(request.stepId);
    const answer = (decision: StepCallDecision, call?: StepCall) => create(BeginStepCallResponseSchema, { decision, call });
    if (entry && (entry.status === StepCallStatus.SUCCEEDED || entry.status === StepCallStatus.FAILED)) {
      return answer(StepCallDecision.RECORDED, entry);
    }
    if (entry?.status === StepCallStatus.STARTED) {
      if (entry.attempt === this.attempt) return answer(StepCallDecision.RUN, entry);
      if (request.unsafeToRepeat) {
        this.blockedOn = request.stepId;
        return answer(StepCallDecision.UNCERTAIN, entry);
      }
      return answer(StepCallDecision.RUN, entry);
    }
    if (!request.unsafeToRepeat) return answer(StepCallDecision.RUN);
    const started = this.newEntry(request);
    started.status = StepCallStatus.STARTED;
    this.journal.set(started.seq, started);
    return answer(StepCallDecision.RUN, started);
  }

  async emitChunks(request: EmitChunksRequest): Promise<EmitChunksResponse> {
    this.checkLease(request.leaseToken);
    const offsets: bigint[] = [];
    const duplicate: boolean[] = [];
    for (const chunk of request.chunks) {
      const id = [request.node, chunk.stream, chunk.stepId, chunk.seq].join("\u0000");
      let offset = this.chunkOffsets.get(id);
      duplicate.push(offset !== undefined);
      if (offset === undefined) {
        const chunks = (this.streams[chunk.stream] ??= []);
        const data = chunk.data.case === "json" ? (JSON.parse(chunk.data.value) as JsonValue) : (chunk.data.value ?? "");
        offset = chunks.push(data) - 1;
        this.chunkOffsets.set(id, offset);
      }
      offsets.push(BigInt(offset));
    }
    return create(EmitChunksResponseSchema, { offsets, duplicate });
  }

  async createApproval(request: CreateApprovalRequest): Promise<CreateApprovalResponse> {
    this.checkLease(request.leaseToken);
    const approval = this.approvals.get(request.stepId) ?? {
      approvalId: `approval-${this.approvals.size + 1}`,
      event: `approval:approval-${this.approvals.size + 1}`,
      title: request.title,
      token: "",
      tokens: 0,
    };
    approval.tokens += 1;
    approval.token = `token-${approval.approvalId}-${approval.tokens}`;
    this.approvals.set(request.stepId, approval);
    const timeoutMs = request.timeout ? Number(request.timeout.seconds) * 1000 + request.timeout.nanos / 1e6 : 7 * 86_400_000;
    return create(CreateApprovalResponseSchema, {
      approvalId: approval.approvalId,
      token: approval.token,
      url: `/callbacks/${approval.token}`,
      expiresAt: timestampFromMs(Date.now() + timeoutMs),
      event: approval.event,
      decided: false,
    });
  }

  async endStepCall(request: EndStepCallRequest): Promise<EndStepCallResponse> {
    this.checkLease(request.leaseToken);
    if (this.crashAfter !== undefined && request.stepId === this.crashAfter) {
      this.crashed = true;
      throw new SimulatedCrash(`the worker crashed after step ${request.stepId} ran`);
    }
    const entry = this.entry(request.stepId);
    if (entry && (entry.status === StepCallStatus.SUCCEEDED || entry.status === StepCallStatus.FAILED)) {
      return create(EndStepCallResponseSchema, { call: entry, duplicate: true });
    }
    const base = entry ?? this.newEntry(request);
    const recorded =
      request.outcome.case === "error"
        ? this.record(base, StepCallStatus.FAILED, { error: request.outcome.value })
        : this.record(base, StepCallStatus.SUCCEEDED, { output: request.outcome.value ?? toValue(null) });
    recorded.unsafeToRepeat = request.unsafeToRepeat;
    if (request.argsDigest) recorded.argsDigest = request.argsDigest; // else the Begin's stands
    return create(EndStepCallResponseSchema, { call: recorded });
  }

  async wait(request: WaitRequest): Promise<WaitResponse> {
    this.checkLease(request.leaseToken);
    const until = request.until;
    const fn = until.case === "wakeAt" ? "cyclone.sleep" : until.case === "event" ? "cyclone.event" : "cyclone.child";
    let entry = this.entry(request.stepId) ?? this.newEntry(request, fn);
    if (!this.journal.has(entry.seq)) {
      if (until.case === "wakeAt" && until.value) entry.wakeAt = until.value;
      if (until.case === "event" && until.value.timeout) {
        entry.wakeAt = timestampFromMs(this.now + Number(until.value.timeout.seconds) * 1000 + until.value.timeout.nanos / 1e6);
      }
      entry.status = StepCallStatus.WAITING;
      this.journal.set(entry.seq, entry);
    }
    const ready = (status: StepCallStatus, fields: Partial<Pick<StepCall, "output" | "error">>) => {
      entry = this.record(entry, status, fields);
      return create(WaitResponseSchema, { decision: WaitDecision.READY, call: entry });
    };
    const wakeAt = entry.wakeAt ? timestampMs(entry.wakeAt) : undefined;
    if (until.case === "wakeAt" && wakeAt !== undefined && wakeAt <= this.now) return ready(StepCallStatus.SUCCEEDED, { output: toValue(null) });
    if (until.case === "event") {
      const i = this.events.findIndex((e) => e.name === until.value.name);
      if (i >= 0) return ready(StepCallStatus.SUCCEEDED, { output: toValue(this.events.splice(i, 1)[0].payload) });
      if (wakeAt !== undefined && wakeAt <= this.now) {
        return ready(StepCallStatus.FAILED, { error: create(StepCallErrorSchema, { type: "EventTimeout", message: `no event ${until.value.name} came in time` }) });
      }
    }
    if (until.case === "childRunId") {
      const child = this.children.get(until.value);
      if (child?.result !== undefined) return ready(StepCallStatus.SUCCEEDED, { output: toValue(child.result) });
      if (child?.failed !== undefined) {
        return ready(StepCallStatus.FAILED, { error: create(StepCallErrorSchema, { type: "ChildFailed", message: child.failed }) });
      }
    }
    entry.waitingFor = until.case === "wakeAt" ? "sleep" : until.case === "event" ? `event ${until.value.name}` : `child ${String(until.value)}`;
    return create(WaitResponseSchema, { decision: WaitDecision.SUSPENDED, call: entry });
  }

  async startChild(request: StartChildRequest): Promise<StartChildResponse> {
    this.checkLease(request.leaseToken);
    const entry = this.entry(request.stepId);
    if (entry?.status === StepCallStatus.SUCCEEDED) {
      const runId = String((fromValue(entry.output) as { run_id: string }).run_id);
      return create(StartChildResponseSchema, { childRunId: runId, created: false, call: entry });
    }
    const runId = `child-${this.children.size + 1}`;
    this.children.set(runId, { workflow: request.workflow?.name ?? "", input: fromValue(request.input) });
    const recorded = this.record(this.newEntry(request, "cyclone.start_child"), StepCallStatus.SUCCEEDED, { output: toValue({ run_id: runId }) });
    return create(StartChildResponseSchema, { childRunId: runId, created: true, call: recorded });
  }
}

/** One crash point tried by explore(), and what the node did after it. */
export interface CrashPoint {
  /** The step id the worker crashed after (its function ran, unrecorded). */
  stepId: string;
  /** The attempts, from the crash to the end. */
  attempts: AttemptResult[];
  /** How many times each step function ran in all. */
  executions: Record<string, number>;
  /** What went wrong, if anything. */
  problems: string[];
}

export class Exploration {
  constructor(
    /** The run without a crash. */
    readonly baseline: AttemptResult,
    readonly points: CrashPoint[],
  ) {}

  get problems(): string[] {
    return this.points.flatMap((p) => p.problems.map((problem) => `crash after ${p.stepId}: ${problem}`));
  }

  /** Throws an Error listing every problem found, if any. */
  assertOk(): void {
    const problems = this.problems;
    if (problems.length > 0) throw new Error(`the durable function does not recover from every crash:\n  ${problems.join("\n  ")}`);
  }
}

/**
 * Runs `body` once without a crash, then once per step call of that run with a crash
 * right after the call's function ran, and again until it settles: an unsafe call is
 * blocked and resolved with the result it had in the crash-free run. Each must end as
 * the crash-free run did, and run no function more than twice (no unsafe one more
 * than once).
 */
export async function explore(body: Handler, options: NodeOptions = {}): Promise<Exploration> {
  const clean = new DurableNode(body, options);
  const baseline = await clean.run();
  const stepIds = clean.entries().filter((e) => !e.function.startsWith("cyclone.")).map((e) => e.stepId);
  const points: CrashPoint[] = [];
  for (const stepId of stepIds) {
    const node = new DurableNode(body, options);
    const first = await node.run({ crashAfter: stepId });
    const problems: string[] = [];
    if (first.status !== "crashed") problems.push(`the first attempt did not reach ${stepId} (${first.status})`);
    for (let i = 0; i < 10; i++) {
      const next = await node.run();
      if (next.status === "blocked" && next.blockedOn) {
        const recorded = clean.entry(next.blockedOn);
        node.resolve(next.blockedOn, { result: fromValue(recorded?.output) });
        continue;
      }
      if (next.status !== "crashed") break;
    }
    const last = node.attempts.at(-1);
    if (last?.status !== baseline.status) problems.push(`it ended ${last?.status}, the crash-free run ${baseline.status}`);
    else if (JSON.stringify(last.output) !== JSON.stringify(baseline.output)) {
      problems.push(`its output ${JSON.stringify(last.output)} differs from the crash-free run's ${JSON.stringify(baseline.output)}`);
    }
    for (const [name, n] of Object.entries(node.executions)) {
      const unsafe = clean.entries().some((e) => e.function === name && e.unsafeToRepeat);
      if (n > (clean.executions[name] ?? 0) + (unsafe ? 0 : 1)) problems.push(`${name} ran ${n} times`);
    }
    points.push({ stepId, attempts: node.attempts, executions: { ...node.executions }, problems });
  }
  return new Exploration(baseline, points);
}
