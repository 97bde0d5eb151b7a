// Workflows as plain objects: `{ name, nodes: [{ name, action, dependsOn, ... }] }`,
// the shape of the Workflow message (durations as Duration messages; see `seconds`).

import { create, isMessage, toJson, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, type Duration } from "@bufbuild/protobuf/wkt";

import { WorkflowSchema, type Workflow } from "./gen/cyclone/v1/types_pb.js";

/** A workflow as a plain object, as protobuf-es takes it. */
export type WorkflowInit = MessageInitShape<typeof WorkflowSchema>;

export function toWorkflowMessage(workflow: WorkflowInit | Workflow): Workflow {
  return isMessage(workflow, WorkflowSchema) ? workflow : create(WorkflowSchema, workflow);
}

/** A Duration of `n` seconds, for a node's timeout or a retry's backoff. */
export function seconds(n: number): Duration {
  return durationFromMs(n * 1000);
}

/** The workflow as proto3 JSON, as grpcurl would send it. */
export function workflowToJson(workflow: WorkflowInit | Workflow): JsonValue {
  return toJson(WorkflowSchema, toWorkflowMessage(workflow));
}
