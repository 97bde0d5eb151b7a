// The worker: it serves a set of actions on the Work stream (Claim and Complete when
// the server has no Work), heartbeats each step at a third of its lease, runs each
// handler under the step's deadline with a signal that aborts when the lease is lost
// or the run cancelled, and reports the outcome. stop() stops claiming and waits for
// the handlers in flight.

import { hostname } from "node:os";

import { create } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";

import {
  ActionSpecSchema,
  CompleteRequestSchema,
  WorkerService,
  WorkRequestSchema,
  type ActionSpec,
  type BlockedStep,
  type ClaimedStep,
  type CompleteRequest,
  type WorkRequest,
} from "./gen/cyclone/v1/worker_service_pb.js";
import { LogBuffer, StepContext } from "./context.js";
import { BodyMessages } from "./inbox.js";
import {
  failureMessage,
  Failure,
  LeaseLost,
  NodeStopped,
  nonRetryable,
  outputTooLarge,
  RunCancelled,
  Suspended,
} from "./errors.js";
import { DEFAULT_LIMITS, Journal, retryUnavailable, sleepFor as sleep, type JournalLimits } from "./journal.js";
import { NotJsonError, toValue, valueSize } from "./json.js";
import { endStepSpan, inStepSpan, startStepSpan } from "./tracing.js";
import { makeTransport, type ConnectOptions } from "./transport.js";

/** A handler: its return value is the step's output (JSON); a throw is its failure. */
export type Handler = (ctx: StepContext) => unknown;

export interface ActionDefinition {
  handler: Handler;
  /**
   * The effect must not happen twice: a step of it that lost its lease with no outcome
   * blocks its run for an operator instead of running again.
   */
  unsafeToRepeat?: boolean;
}

/** Something the worker says about itself; default: one line per event on stderr. */
export interface WorkerLogger {
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

export const consoleLogger: WorkerLogger = {
  info: (message, fields) => console.error(line("INFO", message, fields)),
  warn: (message, fields) => console.error(line("WARN", message, fields)),
  error: (message, fields) => console.error(line("ERROR", message, fields)),
};

function line(level: string, message: string, fields: Record<string, unknown> = {}): string {
  const parts = Object.entries(fields).map(([k, v]) => `${k}=${typeof v === "string" && !/\s/.test(v) ? v : JSON.stringify(v)}`);
  return [new Date().toISOString(), level, message, ...parts].join(" ");
}

export interface WorkerOptions extends ConnectOptions {
  /** The actions served, by name. */
  actions: Record<string, Handler | ActionDefinition>;
  /** Shown in GetRun; default host:pid. */
  id?: string;
  /** Handlers running at once; default 4. */
  concurrency?: number;
  /** The lease asked for each step, in ms; heartbeats every third. Default 30 s. */
  leaseMs?: number;
  /** The long-poll of each Claim (when the server has no Work stream), in ms. Default 10 s. */
  claimWaitMs?: number;
  /** Use the Work stream (default), or only Claim and Complete. */
  workStream?: boolean;
  logger?: WorkerLogger;
  /** Lower limits of your own; the server's (announced on the Work stream) otherwise. */
  limits?: Partial<JournalLimits>;
  /** A build id, sent with every claim. */
  buildId?: string;
  /**
   * On Citus, the node ("host:port", as the cluster names it) whose shards' runs this
   * worker takes, and no others. A server that cannot honour it refuses the claims
   * with InvalidArgument, and run() rejects with that error. Default: any node
   * (docs/scaling.md).
   */
  shardNode?: string;
}

type WorkerClient = Client<typeof WorkerService>;

/** A queue of requests that a stream reads as an async iterable. */
class RequestQueue {
  private items: WorkRequest[] = [];
  private wake: (() => void) | undefined;
  closed = false;

  push(item: WorkRequest): void {
    if (this.closed) return;
    this.items.push(item);
    this.notify();
  }

  close(): void {
    this.closed = true;
    this.notify();
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  async *stream(): AsyncGenerator<WorkRequest> {
    for (;;) {
      const item = this.items.shift();
      if (item) {
        yield item;
        continue;
      }
      if (this.closed) return;
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }
}

/**
 * One Work stream: the completions it carries, one report in flight at a time. The
 * outcomes that finish while a report is on its way, or in the same turn of the event
 * loop, go together in the next report, which grants the credit of the slots they free
 * (so its answer comes with the next steps); the slots freed with nothing to report are
 * granted at the end of the turn, with that report or in a request of credit alone.
 */
class Session {
  readonly requests = new RequestQueue();
  /** Completions waiting for the next report, and the slots they free. */
  queued: CompleteRequest[] = [];
  /** The reports sent and not answered, oldest first. */
  inFlight: CompleteRequest[][] = [];
  /** Slots freed with nothing to report, not granted yet. */
  alone = 0;
  /** A flush is due at the end of this turn of the event loop. */
  flushDue = false;
  ended = false;
}

/**
 * How one step stops. Its AbortSignal is made only when something asks for it (the
 * handler's ctx.signal, a durable call), already aborted if the step has stopped: a
 * step whose handler returns with nobody holding its signal makes no controller, no
 * NodeStopped and no abort event.
 */
class StepStop {
  private controller: AbortController | undefined;
  /** Why the step must stop, when something stopped it before its handler returned. */
  reason: Error | undefined;
  private done = false;

  readonly signal = (): AbortSignal => {
    if (this.controller === undefined) {
      this.controller = new AbortController();
      const reason = this.reason ?? (this.done ? new NodeStopped("the handler returned") : undefined);
      if (reason !== undefined) this.controller.abort(reason);
    }
    return this.controller.signal;
  };

  /** Stops the step (the first reason wins); its signal aborts with `reason`. */
  readonly abort = (reason: Error): void => {
    if (this.done || this.reason !== undefined) return;
    this.reason = reason;
    this.controller?.abort(reason);
  };

  /** Whether the step has stopped, or its handler returned. */
  readonly stopped = (): boolean => this.done || this.reason !== undefined;

  /** The handler returned: whatever it left running sees its signal abort (NodeStopped). */
  returned(): void {
    if (this.done) return;
    this.done = true;
    if (this.reason === undefined) this.controller?.abort(new NodeStopped("the handler returned"));
  }
}

export class Worker {
  readonly id: string;
  readonly client: WorkerClient;
  private readonly actions = new Map<string, ActionDefinition>();
  private readonly concurrency: number;
  private readonly leaseMs: number;
  private readonly claimWaitMs: number;
  private readonly log: WorkerLogger;
  private limits: JournalLimits;
  private readonly ownLimits: Partial<JournalLimits>;
  private useWork: boolean;
  /** The last Work stream ended with a report on its way. */
  private reportEnded = false;
  private readonly buildId: string;
  private readonly shardNode: string;

  private running = 0;
  private readonly inFlight = new Set<Promise<void>>();
  private readonly stopping = new AbortController();
  private session: Session | undefined;
  private slotFreed: (() => void) | undefined;
  private started = false;
  /** The queries and updates of the bodies running here. */
  private readonly messages: BodyMessages;

  constructor(options: WorkerOptions) {
    this.id = options.id ?? `${hostname()}:${process.pid}`;
    this.client = createClient(WorkerService, makeTransport(options));
    for (const [name, action] of Object.entries(options.actions ?? {})) {
      const definition = typeof action === "function" ? { handler: action } : action;
      if (typeof definition?.handler !== "function") {
        throw new TypeError(`action "${name}": expected a handler function or { handler, unsafeToRepeat }, got ${typeof action}`);
      }
      this.actions.set(name, definition);
    }
    if (this.actions.size === 0) throw new Error("the worker serves no action: pass { actions: { name: handler } }");
    this.concurrency = Math.max(1, Math.floor(options.concurrency ?? 4));
    this.leaseMs = options.leaseMs ?? 30_000;
    this.claimWaitMs = options.claimWaitMs ?? 10_000;
    this.log = options.logger ?? consoleLogger;
    this.ownLimits = options.limits ?? {};
    this.limits = { ...DEFAULT_LIMITS, ...this.ownLimits };
    this.useWork = options.workStream ?? true;
    this.buildId = options.buildId ?? "";
    this.shardNode = options.shardNode ?? "";
    this.messages = new BodyMessages(this.client, this.log);
    const { maxPayloadBytes, maxStepCalls } = this.limits;
    if (!(maxPayloadBytes > 0) || !(maxStepCalls > 0) || maxStepCalls > DEFAULT_LIMITS.maxStepCalls) {
      throw new Error(`limits: maxPayloadBytes must be positive, maxStepCalls 1-${DEFAULT_LIMITS.maxStepCalls}`);
    }
  }

  private specs(): ActionSpec[] {
    return [...this.actions].map(([name, a]) => create(ActionSpecSchema, { name, unsafeToRepeat: a.unsafeToRepeat ?? false }));
  }

  /**
   * Claims and runs steps until stop() (or SIGINT/SIGTERM with `handleSignals`), then
   * waits for the handlers in flight and returns.
   */
  async run(options: { handleSignals?: boolean } = {}): Promise<void> {
    if (this.started) throw new Error("a worker runs once");
    this.started = true;
    const cleanup = options.handleSignals ? this.handleSignals() : () => {};
    this.log.info("worker started", { worker: this.id, actions: [...this.actions.keys()].join(","), concurrency: this.concurrency });
    let refused: ConnectError | undefined;
    try {
      let delay = 0;
      while (!this.stopping.signal.aborted) {
        try {
          if (this.useWork) await this.workSession();
          else await this.claimOnce();
          delay = 0;
        } catch (error) {
          if (this.stopping.signal.aborted) break;
          if (error instanceof ConnectError && error.code === Code.Unimplemented && this.useWork) {
            this.log.info("the server has no Work stream: claiming with Claim");
            this.useWork = false;
            continue;
          }
          if (this.refusedForGood(error)) {
            refused = error;
            this.log.error("the server refuses this worker's claims; stopping", { error: describe(error) });
            this.stop();
            break;
          }
          delay = Math.min(Math.max(2 * delay, 100), 5000);
          this.log.warn("claiming failed; retrying", { error: describe(error), in_ms: delay });
          await sleep(delay, this.stopping.signal);
        }
      }
      this.log.info("worker stopping: waiting for the handlers in flight", { running: this.running });
      while (this.inFlight.size > 0) await Promise.allSettled([...this.inFlight]);
      await this.messages.drain();
      this.log.info("worker stopped");
    } finally {
      cleanup();
    }
    if (refused !== undefined) throw refused;
  }

  /**
   * A refusal that claiming again would meet again: a bad token, a missing role, or
   * what the worker claims with (its actions, its build, its shard node) refused. An
   * InvalidArgument that ended a stream with a report on its way is the report's
   * (its outcomes go again by CompleteMany, which says so), not the claim's.
   */
  private refusedForGood(error: unknown): error is ConnectError {
    if (!(error instanceof ConnectError)) return false;
    if (error.code === Code.Unauthenticated || error.code === Code.PermissionDenied) return true;
    return error.code === Code.InvalidArgument && !(this.useWork && this.reportEnded);
  }

  /** Stops claiming; run() returns once the handlers in flight have finished and reported. */
  stop(): void {
    if (this.stopping.signal.aborted) return;
    this.stopping.abort();
    const session = this.session;
    // Closing our side ends the session once the reports sent are answered; the
    // outcomes still to come go by Complete.
    if (session) session.requests.close();
    this.slotFreed?.();
  }

  /** SIGINT or SIGTERM stops the worker; a second one exits at once. The remover. */
  handleSignals(): () => void {
    const onSignal = (signal: NodeJS.Signals): void => {
      if (this.stopping.signal.aborted) {
        this.log.warn("second signal: exiting now", { signal });
        process.exit(1);
      }
      this.log.info("signal: stopping", { signal });
      this.stop();
    };
    process.on("SIGINT", onSignal);
    process.on("SIGTERM", onSignal);
    return () => {
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
    };
  }

  // -- the Work stream ------------------------------------------------------------

  private async workSession(): Promise<void> {
    const session = new Session();
    this.session = session;
    session.requests.push(
      create(WorkRequestSchema, {
        open: {
          workerId: this.id,
          actions: this.specs(),
          lease: durationFromMs(this.leaseMs),
          buildId: this.buildId,
          shardNode: this.shardNode,
        },
        credit: this.concurrency - this.running,
      }),
    );
    try {
      for await (const response of this.client.work(session.requests.stream())) {
        if (response.limits) this.adopt(response.limits.maxPayloadBytes, response.limits.maxStepCalls);
        this.blocked(response.blocked);
        for (const step of response.steps) this.start(step);
        if (response.report) {
          const answered = session.inFlight.shift() ?? [];
          response.report.results.forEach((result, i) => {
            if (result.result.case === "error") {
              const request = answered[i];
              this.log.warn("completion refused", {
                run_id: request?.runId,
                node: request?.node,
                code: Code[result.result.value.code] ?? result.result.value.code,
                error: result.result.value.message,
              });
            }
          });
          this.flushSoon(session);
        }
      }
    } finally {
      session.ended = true;
      if (this.session === session) this.session = undefined;
      // The reports not answered, and the outcomes queued, go again by CompleteMany:
      // a repeated completion is answered duplicate.
      const unanswered = [...session.inFlight.flat(), ...session.queued];
      this.reportEnded = session.inFlight.length > 0;
      session.inFlight = [];
      session.queued = [];
      session.requests.close();
      if (unanswered.length > 0) await this.completeMany(unanswered);
    }
  }

  /** Flushes at the end of this turn: the outcomes finishing in it join the report. */
  private flushSoon(session: Session): void {
    if (session.flushDue) return;
    session.flushDue = true;
    setImmediate(() => {
      session.flushDue = false;
      this.flush(session);
    });
  }

  /** Sends the queued outcomes (unless a report is on its way) and the credit of the slots freed. */
  private flush(session: Session): void {
    if (session.ended || session.requests.closed) return;
    const granting = !this.stopping.signal.aborted;
    if (session.inFlight.length === 0 && session.queued.length > 0) {
      const completions = session.queued;
      session.queued = [];
      session.inFlight.push(completions);
      session.requests.push(
        create(WorkRequestSchema, {
          report: { completions, brief: true },
          credit: granting ? completions.length + session.alone : 0,
        }),
      );
      session.alone = 0;
    }
    if (session.alone > 0) {
      if (granting) session.requests.push(create(WorkRequestSchema, { credit: session.alone }));
      session.alone = 0;
    }
  }

  private adopt(maxPayloadBytes: bigint, maxStepCalls: number): void {
    const payload = Number(maxPayloadBytes) || DEFAULT_LIMITS.maxPayloadBytes;
    const calls = maxStepCalls || DEFAULT_LIMITS.maxStepCalls;
    this.limits = {
      maxPayloadBytes: Math.min(payload, this.ownLimits.maxPayloadBytes ?? payload),
      maxStepCalls: Math.min(calls, this.ownLimits.maxStepCalls ?? calls),
    };
  }

  private blocked(blocked: BlockedStep[]): void {
    for (const b of blocked) {
      this.log.warn("run blocked: its step is unsafe to repeat and may have had its effect", {
        run_id: b.runId,
        node: b.node,
        attempt: b.attempt,
        step_id: b.stepId,
        reason: b.reason,
      });
    }
  }

  // -- Claim ----------------------------------------------------------------------

  private async claimOnce(): Promise<void> {
    while (this.running >= this.concurrency && !this.stopping.signal.aborted) {
      await new Promise<void>((resolve) => (this.slotFreed = resolve));
    }
    if (this.stopping.signal.aborted) return;
    const response = await this.client.claim(
      {
        workerId: this.id,
        actions: this.specs(),
        maxSteps: this.concurrency - this.running,
        wait: durationFromMs(this.claimWaitMs),
        lease: durationFromMs(this.leaseMs),
        buildId: this.buildId,
        shardNode: this.shardNode,
      },
      { signal: this.stopping.signal, timeoutMs: this.claimWaitMs + 10_000 },
    );
    this.blocked(response.blocked);
    for (const step of response.steps) this.start(step);
  }

  // -- one step -------------------------------------------------------------------

  private start(step: ClaimedStep): void {
    this.running++;
    const done = this.runStep(step)
      .catch((error: unknown) => this.log.error("step runner failed", { run_id: step.runId, node: step.node, error: describe(error) }))
      .finally(() => {
        this.inFlight.delete(done);
      });
    this.inFlight.add(done);
  }

  /** A slot is free again; `reported`: its completion goes in the next report (which grants its credit). */
  private async release(reported: CompleteRequest | undefined): Promise<void> {
    this.running--;
    const freed = this.slotFreed;
    this.slotFreed = undefined;
    freed?.();
    const session = this.session;
    const open = session !== undefined && !session.ended && !session.requests.closed;
    if (open) {
      if (reported) session.queued.push(reported);
      else session.alone++;
      this.flushSoon(session);
      return;
    }
    if (reported) await this.complete(reported);
  }

  private async runStep(step: ClaimedStep): Promise<void> {
    const fields = { run_id: step.runId, node: step.node, attempt: step.attempt };
    const action = this.actions.get(step.action);
    if (!action) {
      this.log.error("claimed a step of an action this worker does not serve", { ...fields, action: step.action });
      await this.release(this.failure(step, nonRetryable("UnknownAction", `this worker does not serve the action "${step.action}"`), new LogBuffer()));
      return;
    }
    const stop = new StepStop();
    const abort = stop.abort;
    const deadlineMs = step.deadline ? Number(step.deadline.seconds) * 1000 + step.deadline.nanos / 1e6 : Date.now() + 3600_000;
    const deadline = setTimeout(
      () => abort(new Failure("the handler ran past the node's timeout", { type: "HandlerTimeout" })),
      Math.max(0, deadlineMs - Date.now()),
    );
    const logs = new LogBuffer();
    const journal = new Journal(
      step.journal,
      { runId: step.runId, node: step.node, leaseToken: step.leaseToken, attempt: step.attempt },
      this.client,
      this.limits,
      abort,
      stop.signal,
    );
    journal.warn = (message) => this.log.warn(message, fields);
    this.messages.add(step, journal);
    const ctx = new StepContext(step, journal, stop.signal, logs);
    ctx.flushLogs = () => this.beat(ctx).then(() => undefined, () => undefined);
    const stopBeating = this.heartbeat(ctx, abort, stop.stopped);
    this.log.info("step started", { ...fields, action: step.action });

    let output: unknown;
    let error: unknown;
    let failed = false;
    const traced = startStepSpan(step, this.id); // undefined unless the run is traced
    try {
      output = await inStepSpan(traced, () => action.handler(ctx));
    } catch (thrown) {
      failed = true;
      error = thrown;
    }
    clearTimeout(deadline);
    const reason: unknown = stop.reason;
    stop.returned();
    await stopBeating();
    this.messages.remove(step, journal);

    const stopped = journal.stopped; // a durable call stopped the body: that decides
    if (ctx.completedInTx) {
      this.log.info("step completed in its transaction", fields);
      endStepSpan(traced, "completed");
      await this.release(undefined);
    } else if (stopped instanceof NodeStopped || reason instanceof NodeStopped || error instanceof NodeStopped) {
      const why = stopped ?? (reason instanceof NodeStopped ? reason : (error as Error));
      endStepSpan(traced, why instanceof Suspended ? "suspended" : "dropped");
      if (why instanceof LeaseLost) this.log.warn("lease lost: outcome dropped, the step runs again elsewhere", { ...fields, error: why.message });
      else if (why instanceof RunCancelled) this.log.info("run cancelled: outcome dropped", fields);
      else this.log.warn(`${why.message}; node dropped`, fields);
      await this.release(undefined);
    } else if (stopped) {
      this.log.warn("step failed", { ...fields, error: describe(stopped) });
      endStepSpan(traced, "failed", stopped);
      await this.release(this.failure(step, stopped, logs));
    } else if (failed || reason !== undefined) {
      const why = reason instanceof Failure && reason.type === "HandlerTimeout" ? reason : error;
      this.log.warn("step failed", { ...fields, error: describe(why) });
      endStepSpan(traced, "failed", why);
      await this.release(this.failure(step, why, logs));
    } else {
      let request: CompleteRequest;
      try {
        const value = toValue(output);
        const size = valueSize(value);
        if (size > this.limits.maxPayloadBytes) throw outputTooLarge(size, this.limits.maxPayloadBytes);
        request = create(CompleteRequestSchema, {
          runId: step.runId,
          node: step.node,
          leaseToken: step.leaseToken,
          outcome: { case: "output", value },
          logs: logs.take(),
        });
      } catch (bad) {
        const failure =
          bad instanceof NotJsonError ? nonRetryable("OutputNotJson", `the handler's output is not JSON: ${bad.message}`) : bad;
        this.log.warn("step failed", { ...fields, error: describe(failure) });
        endStepSpan(traced, "failed", failure);
        await this.release(this.failure(step, failure, logs));
        return;
      }
      this.log.info("step succeeded", fields);
      endStepSpan(traced, "completed");
      await this.release(request);
    }
  }

  private failure(step: ClaimedStep, error: unknown, logs: LogBuffer): CompleteRequest {
    return create(CompleteRequestSchema, {
      runId: step.runId,
      node: step.node,
      leaseToken: step.leaseToken,
      outcome: { case: "failure", value: failureMessage(error) },
      logs: logs.take(),
    });
  }

  /**
   * Extends the lease every third of it until the handler returns or the step is `done`;
   * stops the handler on a lost lease or cancel. Returns the stopper: no beat after it,
   * and it resolves once a beat on its way is over. (A timer the stopper clears, not a
   * sleep on the step's signal: the signal need not exist.)
   */
  private heartbeat(ctx: StepContext, stop: (reason: Error) => void, done: () => boolean): () => Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    let beating: Promise<void> | undefined;
    let over = false;
    const schedule = (): void => {
      if (!over) timer = setTimeout(tick, this.leaseMs / 3);
    };
    const tick = (): void => {
      timer = undefined;
      if (over || done()) return;
      beating = this.beatOnce(ctx, stop, done).then((again) => {
        beating = undefined;
        if (again) schedule();
      });
    };
    schedule();
    return () => {
      over = true;
      clearTimeout(timer);
      return beating ?? Promise.resolve();
    };
  }

  /** One beat of `heartbeat`; whether to beat again. */
  private async beatOnce(ctx: StepContext, stop: (reason: Error) => void, done: () => boolean): Promise<boolean> {
    try {
      if (await this.beat(ctx)) {
        stop(new RunCancelled("the run was cancelled"));
        return false;
      }
    } catch (error) {
      if (error instanceof ConnectError && (error.code === Code.Aborted || error.code === Code.NotFound)) {
        stop(new LeaseLost(`lease lost: ${error.rawMessage}`));
        return false;
      }
      if (!done()) this.log.warn("heartbeat failed; retrying at the next beat", { run_id: ctx.runId, node: ctx.node, error: describe(error) });
    }
    return !done();
  }

  /** One heartbeat with the log lines and progress not sent yet; whether the run was cancelled. */
  private async beat(ctx: StepContext): Promise<boolean> {
    const lines = ctx.logs.take();
    const progress = ctx.pendingProgress;
    try {
      const response = await this.client.heartbeat(
        {
          runId: ctx.runId,
          node: ctx.node,
          leaseToken: ctx.leaseToken,
          lease: durationFromMs(this.leaseMs),
          logs: lines,
          progress: progress === undefined ? undefined : toValue(progress),
        },
        { timeoutMs: this.leaseMs / 3 },
      );
      if (progress === ctx.pendingProgress) ctx.pendingProgress = undefined;
      return response.cancelled;
    } catch (error) {
      ctx.logs.restore(lines);
      throw error;
    }
  }

  /** Complete, retried while the server is unavailable. */
  private async complete(request: CompleteRequest): Promise<void> {
    const fields = { run_id: request.runId, node: request.node };
    try {
      await retryUnavailable(() => this.client.complete(request, { timeoutMs: 30_000 }));
    } catch (error) {
      if (error instanceof ConnectError && error.code === Code.Aborted) {
        this.log.warn("completion refused: lease lost", { ...fields, error: error.rawMessage });
      } else {
        this.log.error("completion failed", { ...fields, error: describe(error) });
      }
    }
  }

  private async completeMany(completions: CompleteRequest[]): Promise<void> {
    try {
      const response = await retryUnavailable(() => this.client.completeMany({ completions, brief: true }, { timeoutMs: 30_000 }));
      response.results.forEach((result, i) => {
        if (result.result.case === "error") {
          this.log.warn("completion refused", { run_id: completions[i].runId, node: completions[i].node, error: result.result.value.message });
        }
      });
    } catch (error) {
      this.log.error("completions failed", { count: completions.length, error: describe(error) });
    }
  }
}

function describe(error: unknown): string {
  if (error instanceof ConnectError) return `${Code[error.code]}: ${error.rawMessage}`;
  if (error instanceof Failure) return `${error.type}: ${error.message}`;
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}
