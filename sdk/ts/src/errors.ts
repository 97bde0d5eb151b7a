// The errors a handler or a durable function meets, and how an error becomes the
// failure the server records (a node's Failure, a step call's StepCallError).

import { create } from "@bufbuild/protobuf";

import { StepCallErrorSchema, type StepCallError } from "./gen/cyclone/v1/types_pb.js";
import { FailureSchema, type Failure as FailureMessage } from "./gen/cyclone/v1/worker_service_pb.js";
import { fromValue, toValue, type JsonValue } from "./json.js";

/** The module recorded with the errors this SDK can rebuild on replay. */
export const SDK_MODULE = "@cyclone-workflows/sdk";

/** What the server takes, checked before anything is sent. */
export const DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20;
export const MAX_STEP_CALLS = 10_000;
export const MAX_NAME = 200;
const MAX_ERROR_TEXT = 60 * 1024; // the server takes 64 KiB
const MAX_ERROR_FIELDS = 16 * 1024; // args and attributes, as JSON, together
/** What a step id adds to a step's name: "#" and its occurrence. */
export const OCCURRENCE_ROOM = 7;

export interface FailureInit {
  /** The class of the failure, as operators see it ("CardDeclined"). */
  type?: string;
  /** Free text for people, e.g. a stack. */
  details?: string;
  /** True when another attempt would fail the same way: the node is discarded at once. */
  nonRetryable?: boolean;
  /** The next attempt waits this long instead of the node's backoff. */
  retryAfterMs?: number;
  /** The JS module of the error's type, when it matters to a replay. */
  module?: string;
  /** Fields of the error by name, kept in the journal and given back on replay. */
  attributes?: { [key: string]: JsonValue };
  cause?: unknown;
}

/**
 * A handler's failure with a type and a retry mark; any other Error thrown by a
 * handler is a retryable failure of type `error.name`. A step call's recorded failure
 * comes back to the body as a Failure too, the same on the first run and on replays.
 */
export class Failure extends Error {
  override name = "Failure";
  readonly type: string;
  readonly details: string;
  readonly nonRetryable: boolean;
  readonly retryAfterMs: number | undefined;
  readonly module: string;
  readonly attributes: { [key: string]: JsonValue } | undefined;

  constructor(message: string, init: FailureInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.type = init.type ?? "Failure";
    this.details = init.details ?? "";
    this.nonRetryable = init.nonRetryable ?? false;
    this.retryAfterMs = init.retryAfterMs;
    this.module = init.module ?? "";
    this.attributes = init.attributes;
  }

  override toString(): string {
    return `${this.type}: ${this.message}`;
  }
}

/** A failure that discards the node at once: another attempt would fail the same way. */
export function nonRetryable(type: string, message: string, init: Omit<FailureInit, "type" | "nonRetryable"> = {}): Failure {
  return new Failure(message, { ...init, type, nonRetryable: true });
}

/**
 * A step call whose result is larger than the server's payload limit: the call is
 * recorded failed with it, so the body gets it on its first run and at every replay
 * and can keep the value elsewhere. A body that lets it through fails its node for
 * good.
 */
export class StepResultTooLarge extends Failure {
  override name = "StepResultTooLarge";
  constructor(
    readonly stepId: string,
    readonly fn: string,
    readonly size: number,
    readonly limit: number,
  ) {
    super(
      `step "${stepId}" (${fn}) returned ${size} bytes; the limit of a step result is ${limit} bytes. ` +
        "Keep a large value outside the journal: store it elsewhere (a bucket, a table) and return a reference to it",
      {
        type: "StepResultTooLarge",
        module: SDK_MODULE,
        nonRetryable: true,
        attributes: { step_id: stepId, function: fn, size, limit },
      },
    );
  }
}

/** The failure of a handler whose output is over the payload limit. */
export function outputTooLarge(size: number, limit: number): Failure {
  return new Failure(
    `the handler returned ${size} bytes; the limit of an output is ${limit} bytes. Keep a large value ` +
      "outside: store it elsewhere (a bucket, a table) and return a reference to it",
    { type: "OutputTooLarge", module: SDK_MODULE, nonRetryable: true },
  );
}

/**
 * Why a node stopped without an outcome to report: the worker drops it (the server
 * would refuse a completion, or the node waits for something).
 */
export class NodeStopped extends Error {
  override name = "NodeStopped";
}

/** The lease is lost (Heartbeat said ABORTED, or SQLSTATE CY001): the step may run elsewhere. */
export class LeaseLost extends NodeStopped {
  override name = "LeaseLost";
}

/** The run was cancelled. */
export class RunCancelled extends NodeStopped {
  override name = "RunCancelled";
}

/**
 * An unsafe step call begun by an earlier attempt has no outcome: its effect may have
 * happened. The server blocked the run until an operator resolves the call.
 */
export class EffectUncertain extends NodeStopped {
  override name = "EffectUncertain";
}

/** The body waits (a sleep, an event, a child run): the node gave its lease back. */
export class Suspended extends NodeStopped {
  override name = "Suspended";
}

/** `text` as the server takes it: valid UTF-16 for UTF-8, no NUL, at most `limit` characters. */
export function clip(text: string, limit: number): string {
  let clean = text.replace(/\0/g, "\\0");
  clean = clean.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, "\uFFFD");
  const chars = Array.from(clean);
  if (chars.length <= limit) return clean;
  return chars.slice(0, limit - 20).join("") + " ...(cut)";
}

/** Undefined when `name` is 1-`limit` printable characters, else why not. */
export function badName(what: string, name: string, limit: number): string | undefined {
  const n = Array.from(name).length;
  if (n < 1 || n > limit) return `a ${what} must be 1-${limit} characters, got ${JSON.stringify(name)}`;
  if (/[\p{Cc}\p{Cs}\p{Zl}\p{Zp}]/u.test(name)) return `a ${what} must be printable characters, got ${JSON.stringify(name)}`;
  return undefined;
}

function typeOf(error: unknown): { type: string; message: string; details: string; module: string } {
  if (error instanceof Failure) {
    return { type: error.type, message: error.message, details: error.details || (error.stack ?? ""), module: error.module };
  }
  if (error instanceof Error) {
    const type = error.name && error.name !== "Error" ? error.name : error.constructor.name || "Error";
    return { type, message: error.message, details: error.stack ?? "", module: "" };
  }
  return { type: "thrown", message: String(error), details: "", module: "" };
}

/** What the journal records of a step call's error. */
export function errorRecord(error: unknown): StepCallError {
  const { type, message, details, module } = typeOf(error);
  const record = create(StepCallErrorSchema, {
    type: clip(type || "Error", MAX_NAME),
    message: clip(message, MAX_ERROR_TEXT),
    details: clip(details, MAX_ERROR_TEXT),
    module: module.length <= MAX_NAME ? clip(module, MAX_NAME) : "",
  });
  if (error instanceof Failure && error.attributes) {
    try {
      const value = toValue(error.attributes);
      if (JSON.stringify(fromValue(value)).length <= MAX_ERROR_FIELDS) record.attributes = value;
    } catch {
      // attributes that are not JSON are left out, never the failure itself
    }
  }
  return record;
}

/** What the body gets for a recorded failure: the record, rebuilt when it is one of this SDK's. */
export function recordedFailure(record: StepCallError | undefined): Failure {
  const type = record?.type || "Error";
  const attributes = fromValue(record?.attributes);
  if (record?.module === SDK_MODULE && type === "StepResultTooLarge" && isObject(attributes)) {
    const { step_id, function: fn, size, limit } = attributes;
    if (typeof step_id === "string" && typeof fn === "string" && typeof size === "number" && typeof limit === "number") {
      return new StepResultTooLarge(step_id, fn, size, limit);
    }
  }
  return new Failure(record?.message ?? "", {
    type,
    details: record?.details ?? "",
    module: record?.module ?? "",
    attributes: isObject(attributes) ? attributes : undefined,
  });
}

function isObject(value: JsonValue): value is { [key: string]: JsonValue } {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** The node's failure for a handler's error. */
export function failureMessage(error: unknown): FailureMessage {
  const { type, message, details } = typeOf(error);
  const failure = create(FailureSchema, {
    type: clip(type || "Error", MAX_NAME),
    message: clip(message, MAX_ERROR_TEXT),
    details: clip(details, MAX_ERROR_TEXT),
    nonRetryable: error instanceof Failure && error.nonRetryable,
  });
  if (error instanceof Failure && error.retryAfterMs !== undefined && error.retryAfterMs > 0) {
    const ms = Math.round(error.retryAfterMs);
    failure.retryAfter = { $typeName: "google.protobuf.Duration", seconds: BigInt(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 };
  }
  return failure;
}
