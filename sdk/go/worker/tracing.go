package worker

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The name of the tracer the worker's spans come from, as the Python SDK's.
const tracerName = "cyclone.worker"

// startStepSpan starts the span of a step's handler when its run is traced (the
// ClaimedStep carries the traceparent stored at submit): a child of the run's trace
// context, made by the global tracer provider (otel.SetTracerProvider), so nothing
// is recorded until the program sets one. The handler's context holds the span, so
// spans the handler starts are its children. Without a traceparent, ctx is returned
// with a nil span.
func startStepSpan(ctx context.Context, step *Step, workerID string) (context.Context, trace.Span) {
	if step.GetTraceparent() == "" {
		return ctx, nil
	}
	parent := propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": step.GetTraceparent()})
	return otel.Tracer(tracerName).Start(parent, "step "+step.Node,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("cyclone.run_id", step.RunId),
			attribute.String("cyclone.node", step.Node),
			attribute.String("cyclone.workflow", step.GetWorkflow()),
			attribute.String("cyclone.action", step.Action),
			attribute.Int64("cyclone.attempt", int64(step.Attempt)),
			attribute.String("cyclone.worker_id", workerID),
		))
}

// endStepSpan ends a step's span with its outcome (completed, failed, dropped or
// suspended) as an attribute, and the status ERROR with the error for a failure.
func endStepSpan(span trace.Span, outcome string, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String("cyclone.outcome", outcome))
	switch {
	case outcome == "failed" && err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, fmt.Sprint(err))
	case outcome == "completed":
		span.SetStatus(codes.Ok, "")
	}
	span.End()
}
