package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// runBody runs body as the handler of a claimed step with journal, the way the worker
// does, and returns what it reported with Complete (nil when nothing).
func runBody(t *testing.T, f *fakeServer, body Handler, journal ...*cyclonev1.StepCall) *cyclonev1.CompleteRequest {
	t.Helper()
	w := &Worker{client: f, opts: Options{Lease: time.Minute}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		actions: map[string]Action{"fulfil": {Name: "fulfil", Handler: body}}}
	s, _ := claimed(f, journal...)
	w.runStep(s)
	switch len(f.completes) {
	case 0:
		return nil
	case 1:
		return f.completes[0]
	}
	t.Fatalf("completed %d times: %v", len(f.completes), f.completes)
	return nil
}

// A string of n bytes is a Value of 1 (tag) + the varint of n + n bytes.
func TestAStepResultIsMeasuredAsItsProtobufValueAgainstTheDefaultLimit(t *testing.T) {
	fits := strings.Repeat("x", DefaultMaxPayloadBytes-4) // 1 + 3 + (1 MiB - 4) = 1 MiB
	if size := proto.Size(structpb.NewStringValue(fits)); size != DefaultMaxPayloadBytes {
		t.Fatalf("the test's value is %d bytes", size)
	}
	f := &fakeServer{}
	s, ctx := claimed(f)
	got, err := Call(ctx, s, "render", func(context.Context) (string, error) { return fits, nil })
	if err != nil || len(got) != len(fits) || f.ends[0].GetOutput() == nil {
		t.Fatalf("a result of exactly the limit: %v, ends %d", err, len(f.ends))
	}

	var calls int
	_, err = Call(ctx, s, "render", func(context.Context) (string, error) { calls++; return fits + "x", nil })
	var tooLarge *StepResultTooLarge
	if !errors.As(err, &tooLarge) {
		t.Fatalf("one byte over the limit: %v; want a *StepResultTooLarge", err)
	}
	if *tooLarge != (StepResultTooLarge{StepID: "render#2", Function: "render", Size: DefaultMaxPayloadBytes + 1, Limit: DefaultMaxPayloadBytes}) {
		t.Fatalf("StepResultTooLarge = %+v", *tooLarge)
	}
	var failure *Failure
	if !errors.As(err, &failure) || failure.Type != "StepResultTooLarge" || !failure.NonRetryable {
		t.Fatalf("the failure = %#v; want a non-retryable StepResultTooLarge", failure)
	}
	end := f.ends[1]
	if end.GetOutput() != nil || end.GetError() == nil {
		t.Fatalf("the too large result was sent: %v", end.GetOutput() != nil)
	}
	if e := end.GetError(); e.Type != "StepResultTooLarge" || e.Module != "github.com/cyclone-workflows/cyclone/sdk/go/worker" ||
		!strings.Contains(e.Message, "1048577 bytes") || !strings.Contains(e.Message, "1048576 bytes") ||
		e.GetAttributes().GetStructValue().GetFields()["size"].GetNumberValue() != DefaultMaxPayloadBytes+1 {
		t.Fatalf("recorded error = %v", e)
	}
	// The next call of the body is not affected.
	if n, err := Call(ctx, s, "count", run(&calls, 3, nil)); err != nil || n != 3 || f.ends[2].Seq != 3 {
		t.Fatalf("the call after it: %d, %v", n, err)
	}
}

func TestAnUnsafeCallsTooLargeResultIsEndedFailedAndTheConfiguredLimitHolds(t *testing.T) {
	f := &fakeServer{}
	s, ctx := claimed(f)
	s.limits = Limits{MaxPayloadBytes: 100}
	_, err := Call(ctx, s, "charge", func(context.Context) ([]int, error) { return make([]int, 50), nil }, UnsafeToRepeat())
	var tooLarge *StepResultTooLarge
	if !errors.As(err, &tooLarge) || tooLarge.Limit != 100 || tooLarge.Size <= 100 {
		t.Fatalf("err = %v", err)
	}
	if len(f.begins) != 1 || len(f.ends) != 1 || !f.ends[0].UnsafeToRepeat || f.ends[0].GetError().GetType() != "StepResultTooLarge" {
		t.Fatalf("begins %v, ends %v", f.begins, f.ends)
	}
}

func TestABodyThatLetsATooLargeResultThroughFailsItsNodeForGood(t *testing.T) {
	f := &fakeServer{}
	done := runBody(t, f, func(ctx context.Context, s *Step) (any, error) {
		s.limits = Limits{MaxPayloadBytes: 64}
		return Call(ctx, s, "render", func(context.Context) (string, error) { return strings.Repeat("x", 100), nil })
	})
	if fail := done.GetFailure(); fail.GetType() != "StepResultTooLarge" || !fail.GetNonRetryable() ||
		!strings.Contains(fail.GetMessage(), `step "render" (render) returned 102 bytes`) {
		t.Fatalf("completed with %v", done)
	}
}

func TestARecordedTooLargeResultReplaysAsTheSameTypedError(t *testing.T) {
	f := &fakeServer{}
	attributes, _ := structpb.NewValue(map[string]any{"step_id": "render", "function": "render", "size": 2e6, "limit": 1048576})
	recorded := &cyclonev1.StepCall{StepId: "render", Seq: 1, Function: "render", Attempt: 1,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_FAILED,
		Error: &cyclonev1.StepCallError{Type: "StepResultTooLarge", Module: "github.com/cyclone-workflows/cyclone/sdk/go/worker",
			Message: "too large", Attributes: attributes}}
	s, ctx := claimed(f, recorded)
	var calls int
	_, err := Call(ctx, s, "render", run(&calls, "x", nil))
	var tooLarge *StepResultTooLarge
	if !errors.As(err, &tooLarge) || tooLarge.Size != 2e6 || tooLarge.StepID != "render" || calls != 0 || len(f.ends) != 0 {
		t.Fatalf("replayed %v (%+v), calls %d, ends %d", err, tooLarge, calls, len(f.ends))
	}
}

func TestAnOutputOverTheLimitFailsTheNodeForGoodAndIsNotSent(t *testing.T) {
	f := &fakeServer{}
	done := runBody(t, f, func(context.Context, *Step) (any, error) {
		return strings.Repeat("y", DefaultMaxPayloadBytes), nil
	})
	fail := done.GetFailure()
	if done.GetOutput() != nil || fail.GetType() != "OutputTooLarge" || !fail.GetNonRetryable() ||
		!strings.Contains(fail.GetMessage(), "returned 1048580 bytes; the limit of an output is 1048576 bytes") {
		t.Fatalf("completed with %v", fail)
	}
}

func TestTheCallPastTheJournalsLengthFailsTheNodeForGood(t *testing.T) {
	f := &fakeServer{}
	var calls int
	var past error
	done := runBody(t, f, func(ctx context.Context, s *Step) (any, error) {
		for i := range MaxStepCalls + 1 {
			if _, err := Call(ctx, s, "tick", run(&calls, i, nil)); err != nil {
				past = err
			}
		}
		return "swallowed", nil // the body cannot make it pass
	})
	if calls != MaxStepCalls || len(f.ends) != MaxStepCalls {
		t.Fatalf("ran %d, sent %d; want %d", calls, len(f.ends), MaxStepCalls)
	}
	fail := done.GetFailure()
	if fail.GetType() != "JournalFull" || !fail.GetNonRetryable() || !strings.Contains(fail.GetMessage(), "more than 10000 step calls") ||
		!strings.Contains(fail.GetMessage(), "child runs") || past == nil {
		t.Fatalf("completed with %v (the body saw %v)", done, past)
	}
}

type cardDeclined struct{ Code string }

func (e *cardDeclined) Error() string { return "card declined: " + e.Code }

func TestAFailureIsRecordedWithItsTypeModuleAndDetails(t *testing.T) {
	f := &fakeServer{}
	done := runBody(t, f, func(ctx context.Context, s *Step) (any, error) {
		return Call(ctx, s, "charge", func(context.Context) (int, error) {
			return 0, fmt.Errorf("charge: %w", &cardDeclined{Code: "insufficient_funds"})
		})
	})
	e := f.ends[0].GetError()
	if e.Type != "cardDeclined" || e.Module != "github.com/cyclone-workflows/cyclone/sdk/go/worker" || e.Message != "charge: card declined: insufficient_funds" ||
		!strings.Contains(e.Details, "*fmt.wrapError: charge: card declined") || !strings.Contains(e.Details, "*worker.cardDeclined: card declined") {
		t.Fatalf("recorded %v", e)
	}
	// The body got the failure as recorded, and the node's failure says the same.
	if fail := done.GetFailure(); fail.Type != "cardDeclined" || fail.Message != e.Message || fail.Details != e.Details || fail.NonRetryable {
		t.Fatalf("completed with %v", fail)
	}
}

func TestFailureTextsAreMadeToFitWhatTheServerTakes(t *testing.T) {
	f := &fakeServer{}
	s, ctx := claimed(f)
	long := "bad\x00byte \xff " + strings.Repeat("é", 100_000)
	_, _ = Call(ctx, s, "charge", run(new(int), 0, &Failure{Type: strings.Repeat("T", 300), Message: long}))
	e := f.ends[0].GetError()
	if _, err := proto.Marshal(f.ends[0]); err != nil {
		t.Fatalf("the request does not encode: %v", err)
	}
	if n := utf8.RuneCountInString(e.Message); n > maxErrorText || strings.Contains(e.Message, "\x00") ||
		!utf8.ValidString(e.Message) || !strings.HasPrefix(e.Message, `bad\0byte`) || !strings.HasSuffix(e.Message, "...(cut)") {
		t.Fatalf("message of %d characters: %q...", n, e.Message[:20])
	}
	if n := utf8.RuneCountInString(e.Type); n > maxName {
		t.Fatalf("type of %d characters", n)
	}
}
