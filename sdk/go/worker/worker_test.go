package worker

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
)

func testWorker(f *fakeServer, h Handler) *Worker {
	return &Worker{client: f, opts: Options{Lease: time.Minute}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		actions: map[string]Action{"fulfil": {Name: "fulfil", Handler: h}}}
}

func TestAnOutputThatIsNotJSONFailsTheNodeForGoodNamingTheCause(t *testing.T) {
	f := &fakeServer{}
	w := testWorker(f, func(context.Context, *Step) (any, error) { return map[string]any{"f": func() {}}, nil })
	s, _ := claimed(f)
	w.runStep(s)
	if len(f.completes) != 1 {
		t.Fatalf("completes %v", f.completes)
	}
	failure := f.completes[0].GetFailure()
	if failure.GetType() != "OutputNotJson" || !failure.GetNonRetryable() ||
		!strings.Contains(failure.GetMessage(), "unsupported type: func()") {
		t.Fatalf("failure %v", failure)
	}
}

func TestTheStepsLogLinesTravelWithItsCompletion(t *testing.T) {
	f := &fakeServer{}
	w := testWorker(f, func(_ context.Context, s *Step) (any, error) {
		log := s.Logger().With("logger", "orders")
		log.Info("charging", "amount", 1800)
		log.Warn("slow gateway")
		log.Debug("not kept")
		return "ok", nil
	})
	s, _ := claimed(f)
	w.runStep(s)
	lines := f.completes[0].GetLogs()
	if len(lines) != 2 || lines[0].Message != "charging amount=1800" || lines[0].Level != "INFO" ||
		lines[0].Logger != "orders" || lines[1].Level != "WARNING" || lines[1].At == nil {
		t.Fatalf("logs %v", lines)
	}
}

func TestNewRefusesActionsItCannotServe(t *testing.T) {
	conn := &fakeConn{}
	h := func(context.Context, *Step) (any, error) { return nil, nil }
	for name, tc := range map[string]struct {
		opts    Options
		actions []Action
		want    string
	}{
		"none":      {actions: nil, want: "no action"},
		"no name":   {actions: []Action{{Handler: h}}, want: "has no name"},
		"no code":   {actions: []Action{{Name: "a"}}, want: `action "a" has no handler`},
		"twice":     {actions: []Action{{Name: "a", Handler: h}, {Name: "a", Handler: h}}, want: "given twice"},
		"lease":     {opts: Options{Lease: time.Second}, actions: []Action{{Name: "a", Handler: h}}, want: "too short"},
		"journal":   {opts: Options{Limits: Limits{MaxStepCalls: MaxStepCalls + 1}}, actions: []Action{{Name: "a", Handler: h}}, want: "MaxStepCalls"},
		"negatives": {opts: Options{Concurrency: -1}, actions: []Action{{Name: "a", Handler: h}}, want: "negative"},
	} {
		if _, err := New(conn, tc.opts, tc.actions...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v; want %q", name, err, tc.want)
		}
	}
	if w, err := New(conn, Options{}, Action{Name: "a", Handler: h}); err != nil || w.opts.Concurrency != 4 {
		t.Fatalf("New = %v, %v", w, err)
	}
}

// fakeConn is a connection that New accepts; nothing is sent on it.
type fakeConn struct{ grpc.ClientConnInterface }
