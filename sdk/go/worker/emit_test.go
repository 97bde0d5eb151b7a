package worker

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// emitServer stores chunks by identity as the server does: a repeat is a duplicate.
type emitServer struct {
	fakeServer
	stored map[string]int64
	order  []string
	full   bool
}

func (f *emitServer) EmitChunks(_ context.Context, in *cyclonev1.EmitChunksRequest, _ ...grpc.CallOption) (*cyclonev1.EmitChunksResponse, error) {
	if f.full {
		return nil, status.Error(codes.ResourceExhausted, "the streams of run r-1 are full")
	}
	if f.stored == nil {
		f.stored = map[string]int64{}
	}
	resp := &cyclonev1.EmitChunksResponse{}
	for _, c := range in.Chunks {
		key := fmt.Sprint(in.Node, "/", c.Stream, "/", c.StepId, "/", c.Seq)
		offset, dup := f.stored[key]
		if !dup {
			offset = int64(len(f.order))
			f.stored[key] = offset
			f.order = append(f.order, c.GetText()+c.GetJson())
		}
		resp.Offsets = append(resp.Offsets, offset)
		resp.Duplicate = append(resp.Duplicate, dup)
	}
	return resp, nil
}

func TestAReplayedBodyEmitsItsChunksOnceAndAStepCallsChunksAreItsOwn(t *testing.T) {
	f := &emitServer{}
	body := func(s *Step, ctx context.Context) {
		if _, err := s.Emit(ctx, "out", "start"); err != nil {
			t.Fatal(err)
		}
		_, err := Call(ctx, s, "shout", func(c context.Context) (string, error) {
			_, err := s.Emit(c, "out", map[string]int{"n": 1})
			return "ok", err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s, ctx := claimed(&f.fakeServer)
	s.client = f
	body(s, ctx)
	// The next attempt finds shout recorded: it does not run, and start is a repeat.
	again, ctx := claimed(&f.fakeServer, succeeded(1, "shout", "ok"))
	again.client = f
	body(again, ctx)
	if len(f.order) != 2 || f.order[0] != "start" || f.order[1] != `{"n":1}` {
		t.Fatalf("stored %q; want start then the step call's chunk, once each", f.order)
	}
}

func TestAFullStreamIsANonRetryableFailure(t *testing.T) {
	f := &emitServer{full: true}
	s, ctx := claimed(&f.fakeServer)
	s.client = f
	_, err := s.Emit(ctx, "out", "x")
	var failure *Failure
	if !errors.Is(err, ErrStreamFull) || !errors.As(err, &failure) || !failure.NonRetryable {
		t.Fatalf("err = %v; want a non-retryable StreamFull", err)
	}
}
