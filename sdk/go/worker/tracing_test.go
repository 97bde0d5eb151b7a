package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const runTrace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// traced runs handler as a traced run's step with a recording provider set globally,
// and returns the spans it ended.
func traced(t *testing.T, traceparent string, handler Handler) ([]sdktrace.ReadOnlySpan, *fakeServer) {
	t.Helper()
	recorder := tracetest.NewSpanRecorder()
	before := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder)))
	t.Cleanup(func() { otel.SetTracerProvider(before) })
	f := &fakeServer{}
	w := &Worker{client: f, opts: Options{Lease: time.Minute, ID: "w-1"},
		log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		actions: map[string]Action{"fulfil": {Name: "fulfil", Handler: handler}}}
	s, _ := claimed(f)
	s.Traceparent = traceparent
	s.Workflow = "order"
	w.runStep(s)
	return recorder.Ended(), f
}

func attrs(span sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range span.Attributes() {
		got[kv.Key] = kv.Value
	}
	return got
}

func TestATracedStepsHandlerRunsInAChildSpanOfItsRunsTrace(t *testing.T) {
	var inner trace.SpanContext
	spans, f := traced(t, runTrace, func(ctx context.Context, s *Step) (any, error) {
		_, span := otel.Tracer("app").Start(ctx, "charge card")
		inner = span.SpanContext()
		span.End()
		return "ok", nil
	})
	if len(spans) != 2 || len(f.completes) != 1 {
		t.Fatalf("spans %d, completes %d", len(spans), len(f.completes))
	}
	step := spans[1]
	if step.Name() != "step fulfil" || step.SpanKind() != trace.SpanKindConsumer {
		t.Fatalf("span %q kind %v", step.Name(), step.SpanKind())
	}
	if got := step.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("trace id %s, want the run's", got)
	}
	if got := step.Parent().SpanID().String(); got != "00f067aa0ba902b7" {
		t.Fatalf("parent span %s, want the run's traceparent's", got)
	}
	if inner.TraceID() != step.SpanContext().TraceID() || spans[0].Parent().SpanID() != step.SpanContext().SpanID() {
		t.Fatalf("the handler's own span is not a child of the step's")
	}
	a := attrs(step)
	if a["cyclone.run_id"].AsString() != "r-1" || a["cyclone.node"].AsString() != "fulfil" ||
		a["cyclone.workflow"].AsString() != "order" || a["cyclone.attempt"].AsInt64() != 2 ||
		a["cyclone.worker_id"].AsString() != "w-1" || a["cyclone.outcome"].AsString() != "completed" {
		t.Fatalf("attributes %v", a)
	}
	if step.Status().Code != codes.Ok {
		t.Fatalf("status %v", step.Status())
	}
}

func TestAFailedStepsSpanHasTheErrorAndAnUntracedStepHasNone(t *testing.T) {
	spans, _ := traced(t, runTrace, func(context.Context, *Step) (any, error) {
		return nil, errors.New("card declined")
	})
	if len(spans) != 1 || spans[0].Status().Code != codes.Error ||
		attrs(spans[0])["cyclone.outcome"].AsString() != "failed" || len(spans[0].Events()) != 1 {
		t.Fatalf("spans %v", spans)
	}
	spans, f := traced(t, "", func(context.Context, *Step) (any, error) { return "ok", nil })
	if len(spans) != 0 || len(f.completes) != 1 {
		t.Fatalf("an untraced run made %d spans", len(spans))
	}
}
