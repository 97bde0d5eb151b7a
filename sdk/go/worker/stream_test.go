package worker

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/timestamppb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// streamServer hands out steps on Work as credit allows and answers each report; with
// noStream it answers Work UNIMPLEMENTED and serves Claim and Complete instead.
type streamServer struct {
	cyclonev1.UnimplementedWorkerServiceServer
	noStream bool

	mu        sync.Mutex
	ready     []*cyclonev1.ClaimedStep
	completed map[string]*cyclonev1.CompleteRequest
	credit    []int32
	pinned    []string // the shard node of each stream's open and each Claim
	done      chan struct{}
}

func newStreamServer(n int, noStream bool) *streamServer {
	s := &streamServer{noStream: noStream, completed: map[string]*cyclonev1.CompleteRequest{}, done: make(chan struct{})}
	for i := range n {
		s.ready = append(s.ready, &cyclonev1.ClaimedStep{RunId: "r", Node: string(rune('a' + i)), Action: "echo",
			LeaseToken: "t", Attempt: 1, Deadline: timestamppb.New(time.Now().Add(time.Minute))})
	}
	return s
}

func (s *streamServer) take(n int32) []*cyclonev1.ClaimedStep {
	s.mu.Lock()
	defer s.mu.Unlock()
	n = min(n, int32(len(s.ready)))
	out := s.ready[:n]
	s.ready = s.ready[n:]
	return out
}

func (s *streamServer) record(reqs []*cyclonev1.CompleteRequest) *cyclonev1.CompleteManyResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &cyclonev1.CompleteManyResponse{}
	for _, r := range reqs {
		s.completed[r.Node] = r
		resp.Results = append(resp.Results, &cyclonev1.CompleteResult{Result: &cyclonev1.CompleteResult_Response{
			Response: &cyclonev1.CompleteResponse{Status: cyclonev1.StepStatus_STEP_STATUS_COMPLETED}}})
	}
	if len(s.completed) == 5 {
		close(s.done)
	}
	return resp
}

func (s *streamServer) Work(stream cyclonev1.WorkerService_WorkServer) error {
	if s.noStream {
		return status.Error(codes.Unimplemented, "no Work here")
	}
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.credit = append(s.credit, req.Credit)
		if req.Open != nil {
			s.pinned = append(s.pinned, req.Open.ShardNode)
		}
		s.mu.Unlock()
		resp := &cyclonev1.WorkResponse{Steps: s.take(req.Credit)}
		if req.Report != nil {
			resp.Report = s.record(req.Report.Completions)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (s *streamServer) Claim(_ context.Context, in *cyclonev1.ClaimRequest) (*cyclonev1.ClaimResponse, error) {
	s.mu.Lock()
	s.pinned = append(s.pinned, in.ShardNode)
	s.mu.Unlock()
	return &cyclonev1.ClaimResponse{Steps: s.take(in.MaxSteps)}, nil
}

func (s *streamServer) Complete(_ context.Context, in *cyclonev1.CompleteRequest) (*cyclonev1.CompleteResponse, error) {
	s.record([]*cyclonev1.CompleteRequest{in})
	return &cyclonev1.CompleteResponse{Status: cyclonev1.StepStatus_STEP_STATUS_COMPLETED}, nil
}

func runAgainst(t *testing.T, s *streamServer) {
	t.Helper()
	runWith(t, s, "")
}

// runWith runs a worker against s until it completed its 5 steps, pinned to the
// Citus node shardNode ("" for none).
func runWith(t *testing.T, s *streamServer, shardNode string) {
	t.Helper()
	listener := bufconn.Listen(1 << 20)
	server := grpc.NewServer()
	cyclonev1.RegisterWorkerServiceServer(server, s)
	go func() { _ = server.Serve(listener) }()
	defer server.Stop()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return listener.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echo := func(_ context.Context, step *Step) (any, error) { return step.Node, nil }
	w, err := New(conn, Options{Concurrency: 2, ClaimWait: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		ShardNode: shardNode}, Action{Name: "echo", Handler: echo})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("completed %d of 5 steps", len(s.completed))
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for node, req := range s.completed {
		if req.GetOutput().GetStringValue() != node {
			t.Fatalf("step %s completed with %v", node, req)
		}
	}
}

func TestTheWorkerRunsStepsOnTheWorkStreamWithinItsCredit(t *testing.T) {
	s := newStreamServer(5, false)
	runAgainst(t, s)
	if s.credit[0] != 2 {
		t.Fatalf("credits %v; the stream opens with the free slots", s.credit)
	}
	var granted int32
	for _, c := range s.credit {
		granted += c
	}
	if granted > 2+5 { // the open's, then one per slot freed
		t.Fatalf("credits %v: more than the slots freed", s.credit)
	}
}

func TestTheWorkerClaimsWhereTheServerHasNoStream(t *testing.T) {
	runAgainst(t, newStreamServer(5, true))
}

func TestAWorkerPinnedToANodeNamesItOnItsStreamAndItsClaims(t *testing.T) {
	for _, noStream := range []bool{false, true} {
		s := newStreamServer(5, noStream)
		runWith(t, s, "worker-1:5432")
		if len(s.pinned) == 0 {
			t.Fatalf("noStream=%v: the server saw no open nor claim", noStream)
		}
		for _, node := range s.pinned {
			if node != "worker-1:5432" {
				t.Fatalf("noStream=%v: shard nodes sent %q", noStream, s.pinned)
			}
		}
	}
}
