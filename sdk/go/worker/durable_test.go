package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// fakeServer answers the step call RPCs and Complete from memory, as the server's
// journal would, and records what it was sent.
type fakeServer struct {
	cyclonev1.WorkerServiceClient // the RPCs a test does not expect: nil, they panic

	mu        sync.Mutex
	decision  cyclonev1.StepCallDecision // BeginStepCall's answer to an unsafe call
	endErr    error
	begins    []*cyclonev1.BeginStepCallRequest
	ends      []*cyclonev1.EndStepCallRequest
	completes []*cyclonev1.CompleteRequest
	recorded  map[string]*cyclonev1.StepCall
}

func (f *fakeServer) BeginStepCall(_ context.Context, in *cyclonev1.BeginStepCallRequest, _ ...grpc.CallOption) (*cyclonev1.BeginStepCallResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.begins = append(f.begins, in)
	decision := f.decision
	if decision == cyclonev1.StepCallDecision_STEP_CALL_DECISION_UNSPECIFIED {
		decision = cyclonev1.StepCallDecision_STEP_CALL_DECISION_RUN
	}
	call := &cyclonev1.StepCall{StepId: in.StepId, Seq: in.Seq, Function: in.Function,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_STARTED, UnsafeToRepeat: true, Attempt: 1}
	return &cyclonev1.BeginStepCallResponse{Decision: decision, Call: call}, nil
}

func (f *fakeServer) EndStepCall(_ context.Context, in *cyclonev1.EndStepCallRequest, _ ...grpc.CallOption) (*cyclonev1.EndStepCallResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ends = append(f.ends, in)
	if f.endErr != nil {
		return nil, f.endErr
	}
	if first, ok := f.recorded[in.StepId]; ok {
		return &cyclonev1.EndStepCallResponse{Call: first, Duplicate: true}, nil
	}
	call := &cyclonev1.StepCall{StepId: in.StepId, Seq: in.Seq, Function: in.Function,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, Output: in.GetOutput()}
	if e := in.GetError(); e != nil {
		call.Status, call.Error = cyclonev1.StepCallStatus_STEP_CALL_STATUS_FAILED, e
	}
	return &cyclonev1.EndStepCallResponse{Call: call}, nil
}

func (f *fakeServer) Complete(_ context.Context, in *cyclonev1.CompleteRequest, _ ...grpc.CallOption) (*cyclonev1.CompleteResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.completes = append(f.completes, in)
	return &cyclonev1.CompleteResponse{}, nil
}

func claimed(f *fakeServer, journal ...*cyclonev1.StepCall) (*Step, context.Context) {
	ctx, cancel := context.WithCancelCause(context.Background())
	s := &Step{
		ClaimedStep: &cyclonev1.ClaimedStep{
			RunId: "r-1", Node: "fulfil", Action: "fulfil", LeaseToken: "t-1", Attempt: 2,
			Deadline: timestamppb.New(time.Now().Add(time.Minute)), Journal: journal,
		},
		client: f,
		cancel: cancel,
	}
	return s, ctx
}

func succeeded(seq int32, id string, output any) *cyclonev1.StepCall {
	v, _ := structpb.NewValue(output)
	return &cyclonev1.StepCall{StepId: id, Seq: seq, Function: id, Attempt: 1,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, Output: v}
}

// run is a step function that counts its calls.
func run[T any](calls *int, out T, err error) func(context.Context) (T, error) {
	return func(context.Context) (T, error) {
		*calls++
		return out, err
	}
}

func TestARecordedCallIsReplayedAndTheNextOneRunsAndIsRecorded(t *testing.T) {
	f := &fakeServer{}
	declined := &cyclonev1.StepCall{StepId: "charge", Seq: 2, Function: "charge", Attempt: 1,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_FAILED,
		Error:  &cyclonev1.StepCallError{Type: "CardDeclined", Message: "over the limit"}}
	s, ctx := claimed(f, succeeded(1, "reserve", map[string]any{"id": "r-9"}), declined)
	var calls int

	type reservation struct {
		ID string `json:"id"`
	}
	r, err := Call(ctx, s, "reserve", run(&calls, reservation{ID: "other"}, nil))
	if err != nil || r.ID != "r-9" {
		t.Fatalf("reserve = %+v, %v; want the recorded r-9", r, err)
	}
	_, err = Call(ctx, s, "charge", run(&calls, "ch", nil))
	var failure *Failure
	if !errors.As(err, &failure) || failure.Type != "CardDeclined" || failure.Message != "over the limit" {
		t.Fatalf("charge error = %v; want the recorded CardDeclined", err)
	}
	if calls != 0 || len(f.begins)+len(f.ends) != 0 {
		t.Fatalf("recorded calls ran (%d) or were sent (%d begins, %d ends)", calls, len(f.begins), len(f.ends))
	}

	got, err := Call(ctx, s, "receipt", run(&calls, []int{1, 2}, nil))
	if err != nil || len(got) != 2 || calls != 1 {
		t.Fatalf("receipt = %v, %v after %d calls", got, err, calls)
	}
	if len(f.ends) != 1 || f.ends[0].StepId != "receipt" || f.ends[0].Seq != 3 || f.ends[0].UnsafeToRepeat ||
		f.ends[0].LeaseToken != "t-1" || len(f.ends[0].GetOutput().GetListValue().GetValues()) != 2 {
		t.Fatalf("EndStepCall = %v", f.ends)
	}
	if len(f.begins) != 0 {
		t.Fatalf("a safe call began: %v", f.begins)
	}
}

func TestStepIdsCountOccurrencesUnlessNamed(t *testing.T) {
	f := &fakeServer{}
	s, ctx := claimed(f)
	var calls int
	for range 2 {
		if _, err := Call(ctx, s, "tag", run(&calls, true, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Call(ctx, s, "tag", run(&calls, true, nil), WithStepID("tag-eu")); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range f.ends {
		ids = append(ids, e.StepId+"/"+e.Function)
	}
	if want := []string{"tag/tag", "tag#2/tag", "tag-eu/tag"}; len(ids) != 3 || ids[0] != want[0] || ids[1] != want[1] || ids[2] != want[2] {
		t.Fatalf("step ids = %v, want %v", ids, want)
	}
}

func TestAFailureIsRecordedAndReturnedAsRecorded(t *testing.T) {
	f := &fakeServer{}
	s, ctx := claimed(f)
	var calls int
	_, err := Call(ctx, s, "charge", run(&calls, 0, &Failure{Type: "CardDeclined", Message: "no"}))
	var failure *Failure
	if !errors.As(err, &failure) || failure.Type != "CardDeclined" || failure.NonRetryable {
		t.Fatalf("error = %#v", err)
	}
	if e := f.ends[0].GetError(); e.GetType() != "CardDeclined" || e.GetMessage() != "no" {
		t.Fatalf("recorded error = %v", e)
	}
}

func TestAnUnsafeCallBeginsBeforeItRuns(t *testing.T) {
	f := &fakeServer{}
	s, ctx := claimed(f)
	ran := false
	_, err := Call(ctx, s, "charge", func(context.Context) (string, error) {
		if len(f.begins) != 1 || !f.begins[0].UnsafeToRepeat || f.begins[0].Seq != 1 {
			t.Errorf("ran before BeginStepCall: %v", f.begins)
		}
		ran = true
		return "ch_1", nil
	}, UnsafeToRepeat())
	if err != nil || !ran || len(f.ends) != 1 || !f.ends[0].UnsafeToRepeat {
		t.Fatalf("err %v, ran %v, ends %v", err, ran, f.ends)
	}
}

func TestAStartedCallThatTheCodeNoLongerMarksUnsafeRunsAgain(t *testing.T) {
	f := &fakeServer{}
	started := &cyclonev1.StepCall{StepId: "charge", Seq: 1, Function: "charge", UnsafeToRepeat: true,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_STARTED, Attempt: 1}
	s, ctx := claimed(f, started)
	var calls int
	if _, err := Call(ctx, s, "charge", run(&calls, "ch", nil)); err != nil || calls != 1 || len(f.begins) != 0 {
		t.Fatalf("err %v, calls %d, begins %v", err, calls, f.begins)
	}
}

func TestUncertainStopsTheBodyAndTheWorkerReportsNothing(t *testing.T) {
	f := &fakeServer{decision: cyclonev1.StepCallDecision_STEP_CALL_DECISION_UNCERTAIN}
	started := &cyclonev1.StepCall{StepId: "charge", Seq: 2, Function: "charge", UnsafeToRepeat: true,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_STARTED, Attempt: 1}
	var calls int
	var stopped, later error
	body := func(ctx context.Context, s *Step) (any, error) {
		if _, err := Call(ctx, s, "reserve", run(&calls, "r", nil)); err != nil {
			return nil, err
		}
		_, stopped = Call(ctx, s, "charge", run(&calls, "ch", nil), UnsafeToRepeat())
		_, later = Call(ctx, s, "release", run(&calls, true, nil))
		return "handled", nil // a body that swallows it changes nothing
	}
	w := &Worker{client: f, opts: Options{Lease: time.Minute}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		actions: map[string]Action{"fulfil": {Name: "fulfil", Handler: body}}}
	s, _ := claimed(f, succeeded(1, "reserve", "r"), started)
	w.runStep(s)

	if !errors.Is(stopped, ErrEffectUncertain) || !errors.Is(later, ErrEffectUncertain) {
		t.Fatalf("charge: %v, later call: %v; want ErrEffectUncertain", stopped, later)
	}
	if calls != 0 || len(f.ends) != 0 || len(f.completes) != 0 {
		t.Fatalf("ran %d step functions, %d ends, completes %v; want none", calls, len(f.ends), f.completes)
	}
}

func TestCallsOutOfTheRecordedOrderFailTheNodeForGood(t *testing.T) {
	f := &fakeServer{}
	var calls int
	body := func(ctx context.Context, s *Step) (any, error) {
		_, _ = Call(ctx, s, "charge", run(&calls, "ch", nil)) // the journal has reserve first
		return "ignored the error", nil
	}
	w := &Worker{client: f, opts: Options{Lease: time.Minute}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		actions: map[string]Action{"fulfil": {Name: "fulfil", Handler: body}}}
	s, _ := claimed(f, succeeded(1, "reserve", "r"))
	w.runStep(s)

	if calls != 0 || len(f.completes) != 1 {
		t.Fatalf("calls %d, completes %v", calls, f.completes)
	}
	failure := f.completes[0].GetFailure()
	if failure.GetType() != "ReplayMismatch" || !failure.GetNonRetryable() {
		t.Fatalf("completed with %v; want a non-retryable ReplayMismatch", f.completes[0])
	}
}

func TestADuplicateEndAnswersTheFirstOutcome(t *testing.T) {
	f := &fakeServer{recorded: map[string]*cyclonev1.StepCall{"receipt": succeeded(1, "receipt", "first")}}
	s, ctx := claimed(f)
	var calls int
	got, err := Call(ctx, s, "receipt", run(&calls, "second", nil))
	if err != nil || got != "first" {
		t.Fatalf("got %q, %v; want the first outcome", got, err)
	}
}

func TestALostLeaseAtEndStopsTheBody(t *testing.T) {
	f := &fakeServer{endErr: status.Error(codes.Aborted, "lease lost")}
	s, ctx := claimed(f)
	var calls int
	_, err := Call(ctx, s, "receipt", run(&calls, "sent", nil))
	if !errors.Is(err, ErrLeaseLost) || !errors.Is(context.Cause(ctx), ErrLeaseLost) {
		t.Fatalf("err %v, cause %v; want ErrLeaseLost", err, context.Cause(ctx))
	}
	if _, err := Call(ctx, s, "next", run(&calls, 1, nil)); !errors.Is(err, ErrLeaseLost) || calls != 1 {
		t.Fatalf("a call after the lost lease: %v (calls %d)", err, calls)
	}
}

func TestOutsideADurableFunctionACallJustRuns(t *testing.T) {
	var calls int
	got, err := Call(context.Background(), nil, "tag", run(&calls, 7, nil))
	if err != nil || got != 7 || calls != 1 {
		t.Fatalf("got %d, %v, calls %d", got, err, calls)
	}
}
