package worker_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cyclone-workflows/cyclone/sdk/go/client"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

// teller emits a chunk, waits for the event "more" (giving up its lease), and emits
// another once it came.
func teller(ctx context.Context, step *worker.Step) (any, error) {
	if _, err := step.Emit(ctx, "tokens", "one"); err != nil {
		return nil, err
	}
	more, err := worker.WaitForEvent[int](ctx, step, "more", 0)
	if err != nil {
		return nil, err
	}
	if _, err := step.Emit(ctx, "tokens", map[string]int{"n": more}); err != nil {
		return nil, err
	}
	return "told", nil
}

func TestLiveAStreamIsReadAsItIsWrittenUntilTheRunEnds(t *testing.T) {
	l := liveServer(t)
	l.serve(worker.Action{Name: "live.stream.tell", Handler: teller})
	runID := l.submit("live.stream.tell", nil)

	var chunks []client.Chunk
	for chunk, err := range l.client.ReadStream(l.ctx, runID, "tokens") {
		if err != nil {
			t.Fatalf("after %d chunks: %v", len(chunks), err)
		}
		chunks = append(chunks, chunk)
		if len(chunks) == 1 {
			// The body waits for this event: the second chunk comes after it.
			if _, err := l.client.SendEvent(l.ctx, runID, "more", 2, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The loop ended by itself: the run completed and every chunk was read.
	if len(chunks) != 2 {
		t.Fatalf("read %d chunks, want 2: %+v", len(chunks), chunks)
	}
	first, second := chunks[0], chunks[1]
	if first.Offset != 0 || first.Text != "one" || first.IsJSON() || first.Node != "body" || first.Attempt != 1 {
		t.Errorf("first chunk %+v", first)
	}
	var n struct{ N int }
	if err := second.Decode(&n); err != nil || second.Offset != 1 || !second.IsJSON() || n.N != 2 {
		t.Errorf("second chunk %+v (%v), decoded %+v", second, err, n)
	}
	var told string
	l.done(runID, &told)
	if told != "told" {
		t.Errorf("the output is %q", told)
	}

	streams, err := l.client.ListStreams(l.ctx, runID)
	if err != nil || len(streams) != 1 || streams[0].Name != "tokens" || streams[0].Chunks != 2 {
		t.Fatalf("ListStreams = %v, %v", streams, err)
	}
	var rest []string
	for chunk, err := range l.client.ReadStream(l.ctx, runID, "tokens", client.FromOffset(1), client.NoWait()) {
		if err != nil {
			t.Fatal(err)
		}
		rest = append(rest, string(chunk.JSON))
	}
	if len(rest) != 1 || rest[0] != `{"n":2}` {
		t.Errorf("from offset 1: %q", rest)
	}
}

func TestLiveRefusalsCarryTheirStatusAndNameTheCall(t *testing.T) {
	l := liveServer(t)
	unknown := "00000000-0000-4000-8000-000000000000"
	var readErr error
	for _, err := range l.client.ReadStream(l.ctx, unknown, "tokens") {
		readErr = err
	}
	if status.Code(readErr) != codes.NotFound || !strings.HasPrefix(readErr.Error(), "ReadStream ") {
		t.Errorf("ReadStream of an unknown run: %v", readErr)
	}
	if _, err := l.client.ListStreams(l.ctx, unknown); status.Code(err) != codes.NotFound {
		t.Errorf("ListStreams of an unknown run: %v", err)
	}
	_, err := l.client.Query(l.ctx, unknown, "body", "items", nil)
	if status.Code(err) != codes.NotFound || !strings.HasPrefix(err.Error(), "QueryRun items of ") {
		t.Errorf("Query of an unknown run: %v", err)
	}
	_, err = l.client.Update(l.ctx, unknown, "body", "add", []any{1}, client.WithUpdateID("u-1"))
	if status.Code(err) != codes.NotFound || !strings.HasPrefix(err.Error(), "UpdateRun add of ") {
		t.Errorf("Update of an unknown run: %v", err)
	}
	if _, err := l.client.Update(l.ctx, unknown, "body", "add", []any{make(chan int)}); err == nil ||
		!strings.Contains(err.Error(), "argument 1") {
		t.Errorf("Update with an argument that is not JSON: %v", err)
	}
	if _, err := l.client.DecideApproval(l.ctx, unknown, true, ""); status.Code(err) != codes.NotFound {
		t.Errorf("DecideApproval of an unknown approval: %v", err)
	}
}
