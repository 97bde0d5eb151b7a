package worker_test

// Tests against a real Cyclone server: they run when CYCLONE_TEST_ADDRESS names one
// (tests/test_sdk_go_live.py starts a server and runs them), and are skipped
// otherwise. Each test serves actions of its own, so they share a server.

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/cyclone-workflows/cyclone/sdk/go/client"
	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

// live is a server for a test: a client on it, and workers started with serve.
type live struct {
	t      *testing.T
	client *client.Client
	conn   *grpc.ClientConn
	ctx    context.Context
}

// liveServer is the server of CYCLONE_TEST_ADDRESS, or skips the test. Every call of
// the test is bounded by a minute: a broken wake-up fails it instead of hanging.
func liveServer(t *testing.T) *live {
	t.Helper()
	address := os.Getenv("CYCLONE_TEST_ADDRESS")
	if address == "" {
		t.Skip("CYCLONE_TEST_ADDRESS names no server")
	}
	conn, err := client.Dial(address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return &live{t: t, client: client.New(conn), conn: conn, ctx: ctx}
}

// serve runs a worker of actions until the test ends.
func (l *live) serve(actions ...worker.Action) {
	l.t.Helper()
	w, err := worker.New(l.conn, worker.Options{Concurrency: 2, ClaimWait: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, actions...)
	if err != nil {
		l.t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var done sync.WaitGroup
	done.Go(func() {
		if err := w.Run(ctx); err != nil {
			l.t.Errorf("the worker stopped: %v", err)
		}
	})
	l.t.Cleanup(func() { stop(); done.Wait() })
}

// submit starts a run of a one-node workflow calling action, on node "body".
func (l *live) submit(action string, input any) string {
	l.t.Helper()
	runID, err := l.client.Submit(l.ctx, client.NewWorkflow(action).Node("body", action), input)
	if err != nil {
		l.t.Fatal(err)
	}
	return runID
}

// done waits for the run to settle and returns its node's output, failing the test
// unless it completed.
func (l *live) done(runID string, output any) {
	l.t.Helper()
	run, err := l.client.Wait(l.ctx, runID)
	if err != nil {
		l.t.Fatal(err)
	}
	if run.Status.String() != "RUN_STATUS_COMPLETED" {
		l.t.Fatalf("run %s is %v: %v", runID, run.Status, run.Error)
	}
	if output != nil {
		if err := client.Decode(run.Steps[0].Output, output); err != nil {
			l.t.Fatal(err)
		}
	}
}

func decodeValue(in *structpb.Value, v any) error { return client.Decode(in, v) }

// suspended waits until the run's node waits with no worker running it (and is not
// woken to run again).
func (l *live) suspended(runID string) {
	l.t.Helper()
	for {
		run, err := l.client.GetRun(l.ctx, runID, false)
		if err != nil {
			l.t.Fatal(err)
		}
		step := run.Steps[0]
		woken := step.AvailableAt == nil || step.AvailableAt.AsTime().Before(time.Now().Add(24*time.Hour))
		if step.Status == cyclonev1.StepStatus_STEP_STATUS_AVAILABLE && step.WaitingFor != "" && !woken {
			return
		}
		select {
		case <-l.ctx.Done():
			l.t.Fatalf("run %s never waited: %v", runID, step)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
