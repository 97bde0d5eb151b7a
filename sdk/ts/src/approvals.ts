// Approvals of durable functions (ctx.waitForApproval; docs/time-and-events.md,
// "Approvals"): what the body's send callback gets, and what the journal records of an
// approval call, as the Python SDK records it, so that either SDK replays the other's.
// The journal (journal.ts) makes the calls.

import { durationFromMs, timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";

import { MAX_NAME } from "./errors.js";
import type { WaitRequest } from "./gen/cyclone/v1/worker_service_pb.js";
import type { JsonValue } from "./json.js";

/** The function of an approval call (CreateApproval and the body's send), and the base of its step ids. */
export const APPROVAL_FUNCTION = "cyclone.approval";
export const APPROVAL_BASE = "approval";
/** What an approval call's step id gets for its wait (function cyclone.event). */
export const APPROVAL_WAIT = ".wait";
const MAX_WAIT_MS = 366 * 86_400_000;

/**
 * An approval a durable function asks for, as its `send` callback gets it: the `url`
 * to POST a JSON decision to (once), the bare `token`, the approval's id, and when the
 * token expires.
 */
export interface Approval {
  approvalId: string;
  url: string;
  token: string;
  expiresAt: Date;
}

export interface ApprovalOptions {
  /** How long the token is valid, 1 s to 366 days; default the server's --approval-timeout (7 days). */
  timeoutMs?: number;
  /** What is asked, as the console shows it (at most 1000 characters). */
  title?: string;
  /** The approval call's step id instead of "approval", "approval#2"... (its wait: "<id>.wait"). */
  stepId?: string;
}

/** Why waitForApproval's arguments are refused (before anything is journaled), or undefined. */
export function approvalProblem(send: unknown, { timeoutMs, title = "", stepId }: ApprovalOptions): string | undefined {
  if (typeof send !== "function") return "waitForApproval takes a send function";
  if (timeoutMs !== undefined && !(timeoutMs >= 1000 && timeoutMs <= MAX_WAIT_MS)) {
    return `an approval timeout must be 1 s to 366 days, got ${timeoutMs} ms`;
  }
  if (typeof title !== "string" || title.length > 1000) return "an approval's title must be a string of at most 1000 characters";
  if (stepId !== undefined && stepId.length > MAX_NAME - APPROVAL_WAIT.length) {
    return `an approval's step id must be at most ${MAX_NAME - APPROVAL_WAIT.length} characters`;
  }
  return undefined;
}

/** A Timestamp as Python's datetime.isoformat() writes an aware UTC time. */
function isoformat(at: Timestamp): string {
  const base = timestampDate({ ...at, nanos: 0 }).toISOString().slice(0, 19);
  const micros = Math.floor(at.nanos / 1000);
  return `${base}${micros ? "." + String(micros).padStart(6, "0") : ""}+00:00`;
}

/** What an approval call records (never the token). */
export function askedRecord(approvalId: string, event: string, expiresAt: Timestamp): JsonValue {
  return { approval_id: approvalId, event, expires_at: isoformat(expiresAt) };
}

/** The wait of a recorded approval call: for its event, until its token expires; undefined when it is no approval's record. */
export function approvalWait(asked: JsonValue): WaitRequest["until"] | undefined {
  const recorded = asked as { event?: unknown; expires_at?: unknown } | null;
  if (typeof recorded?.event !== "string" || typeof recorded.expires_at !== "string") return undefined;
  const left = Date.parse(recorded.expires_at) - Date.now();
  const timeout = durationFromMs(Math.min(Math.max(Number.isFinite(left) ? left : 1, 1), MAX_WAIT_MS));
  return { case: "event", value: { $typeName: "cyclone.v1.EventWait", name: recorded.event, timeout } };
}
