// The span of each step of a traced run (its ClaimedStep carries the traceparent the
// server stored at submit): a child of the run's trace context, made by the global
// tracer provider, so nothing is recorded until the program registers one (the
// OpenTelemetry Node SDK, or any provider). The handler runs with the span active: the
// spans it starts are its children when the program has a context manager.

import { context, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Context, type Span } from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";

import type { ClaimedStep } from "./gen/cyclone/v1/worker_service_pb.js";

const propagator = new W3CTraceContextPropagator();

/** The name of the tracer the worker's spans come from, as the Python and Go SDKs'. */
export const TRACER_NAME = "cyclone.worker";

/** How a step's span ends: the `cyclone.outcome` attribute. */
export type StepOutcome = "completed" | "failed" | "suspended" | "dropped" | "stopped";

/** A step's span and the context to run its handler in; undefined when the run is not traced. */
export interface StepSpan {
  span: Span;
  context: Context;
}

export function startStepSpan(step: ClaimedStep, workerId: string): StepSpan | undefined {
  if (!step.traceparent) return undefined;
  const parent = propagator.extract(ROOT_CONTEXT, { traceparent: step.traceparent }, {
    get: (carrier: Record<string, string>, key: string) => carrier[key],
    keys: (carrier: Record<string, string>) => Object.keys(carrier),
  });
  const span = trace.getTracer(TRACER_NAME).startSpan(
    `step ${step.node}`,
    {
      kind: SpanKind.CONSUMER,
      attributes: {
        "cyclone.run_id": step.runId,
        "cyclone.node": step.node,
        "cyclone.workflow": step.workflow,
        "cyclone.action": step.action,
        "cyclone.attempt": step.attempt,
        "cyclone.worker_id": workerId,
      },
    },
    parent,
  );
  return { span, context: trace.setSpan(parent, span) };
}

/** Runs fn with the step's span active (as it is: without a span). */
export function inStepSpan<T>(traced: StepSpan | undefined, fn: () => T): T {
  return traced ? context.with(traced.context, fn) : fn();
}

/** Ends a step's span with its outcome; a failure has the status ERROR and the error recorded. */
export function endStepSpan(traced: StepSpan | undefined, outcome: StepOutcome, error?: unknown): void {
  if (!traced) return;
  const { span } = traced;
  span.setAttribute("cyclone.outcome", outcome);
  if (outcome === "failed") {
    const err = error instanceof Error ? error : new Error(String(error));
    span.recordException(err);
    span.setStatus({ code: SpanStatusCode.ERROR, message: `${err.name}: ${err.message}` });
  } else if (outcome === "completed") {
    span.setStatus({ code: SpanStatusCode.OK });
  }
  span.end();
}
