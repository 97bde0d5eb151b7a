// Queries and updates of the durable functions a worker runs, through
// WorkerService.Inbox (docs/durable-functions.md, "Queries and updates").
//
// While the worker runs bodies that registered handlers, one loop long-polls Inbox with
// their nodes (a body without handlers costs nothing here): the queries asked of them
// are answered at once, here, by the bodies' query handlers; the updates sent to them
// are handed to their bodies, which apply and record them at their next journal point.
// Answers and published query values go in a short Inbox call of their own as soon as
// they are ready.

import { create } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type Client } from "@connectrpc/connect";

import {
  InboxRequestSchema,
  PublishedQuerySchema,
  QueryAnswerSchema,
  type ClaimedStep,
  type InboxRequest,
  type InboxResponse,
  type PublishedQuery,
  type QueryAnswer,
  type WorkerService,
} from "./gen/cyclone/v1/worker_service_pb.js";
import type { BodyHandlers } from "./handlers.js";
import { sleepFor, type Journal } from "./journal.js";
import { fromValue, toValue, type JsonValue } from "./json.js";

/** How long one Inbox waits for a query or an update, in ms. */
export const POLL_WAIT_MS = 2_000;
/** What one Inbox call may take beyond its wait. */
const CALL_TIMEOUT_MS = 30_000;

interface Body {
  handlers: BodyHandlers;
  attempt: number;
  /** The highest update seq handed to this attempt of the body. */
  cursor: bigint;
}

interface Warner {
  warn(message: string, fields?: Record<string, unknown>): void;
}

const keyOf = (runId: string, node: string): string => `${runId}\u0000${node}`;

/** The bodies a worker runs, their queries and updates. */
export class BodyMessages {
  private readonly bodies = new Map<string, Body>();
  /** The bodies that registered a handler: the nodes the poller names. */
  private readonly active = new Set<string>();
  private answers: QueryAnswer[] = [];
  private published = new Map<string, PublishedQuery>();
  private polling: Promise<void> | undefined;
  private sending: Promise<void> | undefined;
  /** Aborts the poll on its way once no body is active. */
  private poll: AbortController | undefined;
  /** The server has no Inbox: nothing is polled. */
  private unimplemented = false;

  constructor(
    private readonly client: Client<typeof WorkerService>,
    private readonly log: Warner,
  ) {}

  /** A body starts: its handlers are served once it registers one. */
  add(step: ClaimedStep, journal: Journal): void {
    const key = keyOf(step.runId, step.node);
    const handlers = journal.handlers;
    this.bodies.set(key, { handlers, attempt: step.attempt, cursor: 0n });
    handlers.onPublish = (values) => this.publish(step, values);
    handlers.onRegister = () => this.activate(key, handlers);
    journal.fetchUpdates = () => this.fetch(step.runId, step.node);
  }

  /** A body ended (its outcome came, or it stopped): its last values are published, and it takes no more queries. */
  remove(step: ClaimedStep, journal: Journal): void {
    const key = keyOf(step.runId, step.node);
    const handlers = journal.handlers;
    if (this.bodies.get(key)?.handlers === handlers) {
      this.bodies.delete(key);
      this.active.delete(key);
      if (this.active.size === 0) this.poll?.abort();
    }
    try {
      handlers.publish();
    } catch {
      // a handler that cannot answer now publishes nothing
    }
    handlers.onPublish = undefined;
    handlers.onRegister = undefined;
    journal.fetchUpdates = undefined;
  }

  /** Waits for the answers and values being sent. */
  async drain(): Promise<void> {
    this.poll?.abort();
    await Promise.allSettled([this.polling, this.sending]);
  }

  private activate(key: string, handlers: BodyHandlers): void {
    if (this.bodies.get(key)?.handlers !== handlers) return;
    this.active.add(key);
    this.startPolling();
  }

  private startPolling(): void {
    this.polling ??= this.pollLoop().finally(() => {
      this.polling = undefined;
      if (this.active.size > 0 && !this.unimplemented) this.startPolling(); // a body activated as the loop ended
    });
  }

  // -- sending

  private publish(step: ClaimedStep, values: Map<string, JsonValue>): void {
    for (const [name, value] of values) {
      this.published.set(
        `${keyOf(step.runId, step.node)}\u0000${name}`,
        create(PublishedQuerySchema, { runId: step.runId, node: step.node, attempt: step.attempt, name, value: toValue(value) }),
      );
    }
    this.sendSoon();
  }

  private sendSoon(): void {
    this.sending ??= this.send().finally(() => {
      this.sending = undefined;
      if (this.answers.length > 0 || this.published.size > 0) this.sendSoon(); // added as the call ended
    });
  }

  /** Answers and published values, in Inbox calls naming no node (no wait). */
  private async send(): Promise<void> {
    await Promise.resolve(); // what this turn adds goes in the same call
    while (this.answers.length > 0 || this.published.size > 0) {
      const request = create(InboxRequestSchema, { answers: this.answers, published: [...this.published.values()] });
      this.answers = [];
      this.published = new Map();
      try {
        await this.inbox(request);
      } catch (error) {
        // The asker times out; the next values go later.
        this.log.warn("Inbox could not send answers or query values", { error: describe(error) });
        return;
      }
    }
  }

  private inbox(request: InboxRequest, signal?: AbortSignal): Promise<InboxResponse> {
    const waitMs = request.wait ? Number(request.wait.seconds) * 1000 : 0;
    return this.client.inbox(request, { timeoutMs: CALL_TIMEOUT_MS + waitMs, signal });
  }

  /**
   * The updates (and queries) waiting for one body now, handed to it: its body is
   * about to wait, and the node's lease goes with the Wait. A failure is logged: the
   * update is then applied at the node's next wake, which the server makes at once.
   */
  private async fetch(runId: string, node: string): Promise<void> {
    const request = create(InboxRequestSchema, { nodes: [{ runId, node, afterUpdate: this.bodies.get(keyOf(runId, node))?.cursor ?? 0n }] });
    try {
      this.handle(await this.inbox(request));
    } catch (error) {
      if (!(error instanceof ConnectError && error.code === Code.Unimplemented)) {
        this.log.warn("Inbox could not fetch the updates of a body", { run_id: runId, node, error: describe(error) });
      }
    }
  }

  // -- receiving

  /** Long-polls Inbox while the worker runs bodies with handlers. */
  private async pollLoop(): Promise<void> {
    let failures = 0;
    while (this.active.size > 0) {
      const nodes = [...this.active].map((key) => {
        const [runId, node] = key.split("\u0000");
        return { runId, node, afterUpdate: this.bodies.get(key)?.cursor ?? 0n };
      });
      const request = create(InboxRequestSchema, { nodes, wait: durationFromMs(POLL_WAIT_MS) });
      const poll = (this.poll = new AbortController());
      try {
        this.handle(await this.inbox(request, poll.signal));
        failures = 0;
      } catch (error) {
        if (poll.signal.aborted) continue;
        if (error instanceof ConnectError && error.code === Code.Unimplemented) {
          this.log.warn("the server has no Inbox: queries and updates are not served");
          this.unimplemented = true;
          return;
        }
        failures++;
        if (failures === 1) this.log.warn("Inbox failed", { error: describe(error) });
        await sleepFor(Math.min(200 * 2 ** failures, 5_000));
      } finally {
        if (this.poll === poll) this.poll = undefined;
      }
    }
  }

  private handle(response: InboxResponse): void {
    for (const update of response.updates) {
      const body = this.bodies.get(keyOf(update.runId, update.node));
      if (body === undefined) continue;
      if (update.seq > body.cursor) body.cursor = update.seq;
      const args = (update.args?.values ?? []).map((v) => fromValue(v));
      body.handlers.deliver({ updateId: update.updateId, name: update.name, args });
    }
    for (const query of response.queries) {
      const answer = create(QueryAnswerSchema, { queryId: query.queryId, runId: query.runId });
      const body = this.bodies.get(keyOf(query.runId, query.node));
      if (body === undefined) {
        answer.errorType = "NotRunning";
        answer.errorMessage = `node ${query.node} is not running on this worker any more`;
      } else {
        const answered = body.handlers.answer(query.name, (query.args?.values ?? []).map((v) => fromValue(v)));
        if ("value" in answered) {
          answer.result = toValue(answered.value);
        } else {
          answer.errorType = answered.error.type;
          answer.errorMessage = answered.error.message;
        }
      }
      this.answers.push(answer);
    }
    if (response.queries.length > 0) this.sendSoon();
  }
}

function describe(error: unknown): string {
  if (error instanceof ConnectError) return `${Code[error.code]}: ${error.rawMessage}`;
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}
