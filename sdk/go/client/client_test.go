package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// fakeWorkflows keeps submitted runs in memory; a run completes at its third GetRun.
type fakeWorkflows struct {
	cyclonev1.UnimplementedWorkflowServiceServer
	mu      sync.Mutex
	submits []*cyclonev1.SubmitRequest
	reads   int
}

func (f *fakeWorkflows) Submit(_ context.Context, in *cyclonev1.SubmitRequest) (*cyclonev1.SubmitResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.submits = append(f.submits, in)
	return &cyclonev1.SubmitResponse{RunId: "r-1"}, nil
}

func (f *fakeWorkflows) GetRun(_ context.Context, in *cyclonev1.GetRunRequest) (*cyclonev1.GetRunResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if in.RunId != "r-1" {
		return nil, status.Error(codes.NotFound, "no run "+in.RunId)
	}
	f.reads++
	run := &cyclonev1.Run{RunId: in.RunId, Status: cyclonev1.RunStatus_RUN_STATUS_RUNNING}
	if f.reads >= 3 {
		run.Status = cyclonev1.RunStatus_RUN_STATUS_COMPLETED
	}
	return &cyclonev1.GetRunResponse{Run: run}, nil
}

func serve(t *testing.T) (*Client, *fakeWorkflows) {
	t.Helper()
	listener := bufconn.Listen(1 << 20)
	server := grpc.NewServer()
	fake := &fakeWorkflows{}
	cyclonev1.RegisterWorkflowServiceServer(server, fake)
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return listener.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return New(conn), fake
}

func TestSubmitSendsTheWorkflowAndWaitReturnsTheSettledRun(t *testing.T) {
	c, fake := serve(t)
	ctx := context.Background()
	wf := NewWorkflow("checkout").
		Node("price", "checkout.price", Input(map[string]int{"items": 2})).
		Node("charge", "checkout.charge", After("price"), Retry(3), Timeout(time.Minute))
	runID, err := c.Submit(ctx, wf, map[string]string{"order": "o-1"}, Priority(5))
	if err != nil || runID != "r-1" {
		t.Fatalf("Submit = %q, %v", runID, err)
	}
	sent := fake.submits[0]
	charge := sent.Workflow.Nodes[1]
	if sent.Priority != 5 || charge.DependsOn[0] != "price" || charge.Retry.MaxAttempts != 3 ||
		sent.Input.GetStructValue().Fields["order"].GetStringValue() != "o-1" {
		t.Fatalf("sent %v", sent)
	}
	run, err := c.Wait(ctx, runID)
	if err != nil || run.Status != cyclonev1.RunStatus_RUN_STATUS_COMPLETED {
		t.Fatalf("Wait = %v, %v", run, err)
	}
}

func TestInputThatIsNotJSONIsAnErrorAndNothingIsSent(t *testing.T) {
	c, fake := serve(t)
	_, err := c.Submit(context.Background(), NewWorkflow("w").Node("a", "a"), make(chan int))
	if err == nil || !strings.Contains(err.Error(), "the input: not JSON") {
		t.Fatalf("err = %v", err)
	}
	_, err = c.Submit(context.Background(), NewWorkflow("w").Node("a", "a", Input(func() {})), nil)
	if err == nil || !strings.Contains(err.Error(), "node a: the input: not JSON") {
		t.Fatalf("err = %v", err)
	}
	if len(fake.submits) != 0 {
		t.Fatalf("sent %d submissions", len(fake.submits))
	}
}

func TestTheServerRefusalIsWrappedWithItsCode(t *testing.T) {
	c, _ := serve(t)
	_, err := c.GetRun(context.Background(), "nope", false)
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "GetRun nope") {
		t.Fatalf("err = %v", err)
	}
	if _, err := c.Resolve(context.Background(), "r-1", "charge", Resolution{}, ""); err == nil {
		t.Fatal("Resolve without a resolution was sent")
	}
}

func TestALostServerIsAnErrorNamingTheCause(t *testing.T) {
	conn, err := Dial("127.0.0.1:1") // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = New(conn).Submit(ctx, NewWorkflow("w").Node("a", "a"), nil)
	if status.Code(err) != codes.Unavailable || !strings.HasPrefix(err.Error(), "Submit: ") {
		t.Fatalf("err = %v", err)
	}
	waitCtx, stop := context.WithCancel(context.Background())
	stop()
	c, _ := serve(t)
	if _, err := c.Wait(waitCtx, "r-1"); !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled {
		t.Fatalf("Wait after the context ended: %v", err)
	}
}
