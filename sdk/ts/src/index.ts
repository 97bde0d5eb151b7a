// @cyclone-workflows/sdk: Cyclone for TypeScript on Node.js.

export { Client, describeRun, jsonToValue, parseRunStatus, runStatusName, runToJson, stepOutput, stepStatusName, WaitTimeout } from "./client.js";
export type { Resolution, RunFilter } from "./client.js";
export { QUERY_TIMEOUT_MS, RunMessages, UPDATE_TIMEOUT_MS } from "./talk.js";
export type { ApprovalInfo, QueryAnswer, ReadStreamOptions, StreamChunk, StreamSummary, UpdateResult } from "./talk.js";
export { ChildRun, LogBuffer, StepContext } from "./context.js";
export type { StepLogger, UpstreamFailure } from "./context.js";
export {
  DEFAULT_MAX_PAYLOAD_BYTES,
  EffectUncertain,
  Failure,
  LeaseLost,
  MAX_STEP_CALLS,
  NodeStopped,
  nonRetryable,
  RunCancelled,
  SDK_MODULE,
  StepResultTooLarge,
  Suspended,
} from "./errors.js";
export type { FailureInit } from "./errors.js";
export { Journal } from "./journal.js";
export { BodyHandlers, UPDATE_FUNCTION, UPDATE_PREFIX } from "./handlers.js";
export type { AppliedUpdate, DeliveredUpdate, HandlerError, MessageHandler } from "./handlers.js";
export type { JournalLimits, NodeLease, StepCallTransport, StepOptions } from "./journal.js";
export { APPROVAL_FUNCTION } from "./approvals.js";
export type { Approval, ApprovalOptions } from "./approvals.js";
export { fromValue, NotJsonError, toPlainJson, toValue, valueSize } from "./json.js";
export type { JsonValue } from "./json.js";
export { DEFAULT_ADDRESS, defaultAddress, makeTransport } from "./transport.js";
export type { ConnectOptions } from "./transport.js";
export { consoleLogger, Worker } from "./worker.js";
export type { ActionDefinition, Handler, WorkerLogger, WorkerOptions } from "./worker.js";
export { seconds, toWorkflowMessage, workflowToJson } from "./workflow.js";
export type { WorkflowInit } from "./workflow.js";
export { RunStatus, StepCallStatus, StepStatus, TriggerRule } from "./gen/cyclone/v1/types_pb.js";
export type { Run, Step, StepCall, Workflow } from "./gen/cyclone/v1/types_pb.js";
export { Code, ConnectError } from "@connectrpc/connect";
export { argsDigest, canonicalJson, digestOf } from "./digest.js";
