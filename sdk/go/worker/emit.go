package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// Output streams (docs/streams.md): a handler appends chunks to named streams of its
// run, which clients read live (ReadStream, `cyclone stream`).
//
// Each chunk is identified by (node, stream, step call, seq): the step call it is
// emitted in (the ctx Call passes to its function; none for the body or a plain
// handler), and seq counting the chunks of that (stream, step call) from 1 in this
// attempt. A durable body that replays emits the same identities in the same order,
// so the chunks an earlier attempt stored are not stored twice.

// ErrStreamFull: an Emit past the server's bounds (--max-stream-chunk-bytes,
// --max-stream-bytes-per-run, --max-stream-chunks-per-run); nothing of it was stored.
// Returned from a handler it fails the node for good (errors.Is finds it).
var ErrStreamFull = errors.New("StreamFull")

// stepCallKey is the context key under which Call passes its step id to its function.
type stepCallKey struct{}

// emitted counts the chunks of one attempt by (stream, step call).
type emitted struct {
	mu   sync.Mutex
	seqs map[[2]string]int32
}

// Emit appends chunk to the run's output stream and returns its offset, once it is
// stored. chunk is a string (text) or any other value JSON can encode (sent as JSON).
// Call it with the handler's ctx, or inside a step call with the ctx Call passed to
// the function. A chunk past the server's bounds returns an error that wraps
// ErrStreamFull (and fails the node for good when the handler returns it); a lost
// lease, ErrLeaseLost.
func (s *Step) Emit(ctx context.Context, stream string, chunk any) (int64, error) {
	if stream == "" {
		return 0, errors.New("a stream's name is a non-empty string")
	}
	item := &cyclonev1.ChunkToEmit{Stream: stream}
	if text, ok := chunk.(string); ok {
		item.Data = &cyclonev1.ChunkToEmit_Text{Text: text}
	} else {
		data, err := json.Marshal(chunk)
		if err != nil {
			return 0, fmt.Errorf("a stream chunk is a string or a JSON value: %w", err)
		}
		item.Data = &cyclonev1.ChunkToEmit_Json{Json: string(data)}
	}
	if id, ok := ctx.Value(stepCallKey{}).(string); ok {
		item.StepId = id
	}
	s.emits.mu.Lock()
	if s.emits.seqs == nil {
		s.emits.seqs = make(map[[2]string]int32)
	}
	key := [2]string{stream, item.StepId}
	s.emits.seqs[key]++
	item.Seq = s.emits.seqs[key]
	s.emits.mu.Unlock()
	req := &cyclonev1.EmitChunksRequest{
		RunId: s.RunId, Node: s.Node, LeaseToken: s.LeaseToken,
		Chunks: []*cyclonev1.ChunkToEmit{item},
	}
	resp, err := retryUnavailable(ctx, func(c context.Context) (*cyclonev1.EmitChunksResponse, error) {
		return s.client.EmitChunks(c, req)
	})
	switch status.Code(err) {
	case codes.OK:
		return resp.GetOffsets()[0], nil
	case codes.ResourceExhausted:
		return 0, &Failure{Type: "StreamFull", Message: status.Convert(err).Message(),
			NonRetryable: true, Err: ErrStreamFull}
	case codes.Aborted:
		return 0, &leaseLost{reason: status.Convert(err).Message()}
	}
	return 0, err
}
