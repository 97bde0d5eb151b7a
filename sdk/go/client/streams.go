package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// Chunk is one chunk of a run's output stream (docs/streams.md): text, or a JSON
// value as its JSON text.
type Chunk struct {
	Offset    int64     // its place in the stream: 0 for the first
	Node      string    // the node that emitted it
	StepID    string    // the step call it was emitted in; "" for a body or a plain handler
	Attempt   int32     // the node's attempt that stored it
	EmittedAt time.Time // when it was stored
	Text      string    // the text of a text chunk
	// The JSON text of a JSON chunk (nil for a text chunk): json.Unmarshal it, or
	// use Decode.
	JSON json.RawMessage
}

// IsJSON says whether the chunk is a JSON value (else it is text).
func (c Chunk) IsJSON() bool { return c.JSON != nil }

// Decode decodes a JSON chunk into v (a pointer, as for json.Unmarshal); a text
// chunk decodes as a JSON string.
func (c Chunk) Decode(v any) error {
	if c.JSON != nil {
		return json.Unmarshal(c.JSON, v)
	}
	raw, err := json.Marshal(c.Text)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, v)
}

func chunkOf(m *cyclonev1.ReadStreamResponse) Chunk {
	c := Chunk{Offset: m.Offset, Node: m.Node, StepID: m.StepId, Attempt: m.Attempt, EmittedAt: m.EmittedAt.AsTime()}
	switch data := m.Data.(type) {
	case *cyclonev1.ReadStreamResponse_Json:
		c.JSON = json.RawMessage(data.Json)
	case *cyclonev1.ReadStreamResponse_Text:
		c.Text = data.Text
	}
	return c
}

// StreamOption changes how ReadStream reads.
type StreamOption func(*cyclonev1.ReadStreamRequest)

// FromOffset starts the read at the chunk of this offset (0, the default: the first).
func FromOffset(offset int64) StreamOption {
	return func(r *cyclonev1.ReadStreamRequest) { r.FromOffset = offset }
}

// NoWait ends the read once the chunks stored now are read, instead of following the
// stream until the run is finished.
func NoWait() StreamOption { return func(r *cyclonev1.ReadStreamRequest) { r.NoWait = true } }

// ReadStream reads the run's output stream named stream, in order: the chunks stored,
// then each new one as it is stored, until the run is finished (completed, failed or
// cancelled) and every chunk it stored was read. A stream nobody wrote is empty.
//
//	for chunk, err := range c.ReadStream(ctx, runID, "tokens") {
//		if err != nil {
//			return err
//		}
//		fmt.Print(chunk.Text)
//	}
//
// An error (an unknown run is NotFound; ctx ending) is the last element, with a zero
// Chunk. Breaking out of the loop ends the read. To resume a read that failed, read
// again FromOffset(the last offset + 1).
func (c *Client) ReadStream(ctx context.Context, runID, stream string, opts ...StreamOption) iter.Seq2[Chunk, error] {
	req := &cyclonev1.ReadStreamRequest{RunId: runID, Stream: stream}
	for _, opt := range opts {
		opt(req)
	}
	return func(yield func(Chunk, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		fail := func(err error) { yield(Chunk{}, fmt.Errorf("ReadStream %s %s: %w", runID, stream, err)) }
		if stream == "" {
			fail(errors.New("a stream's name is a non-empty string"))
			return
		}
		reader, err := c.workflows.ReadStream(ctx, req)
		if err != nil {
			fail(err)
			return
		}
		for {
			m, err := reader.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				fail(err)
				return
			}
			if !yield(chunkOf(m), nil) {
				return
			}
		}
	}
}

// ListStreams returns the run's output streams by name, with how many chunks (the
// next offset) and bytes each holds. NotFound for an unknown run.
func (c *Client) ListStreams(ctx context.Context, runID string) ([]*cyclonev1.StreamSummary, error) {
	resp, err := c.workflows.ListStreams(ctx, &cyclonev1.ListStreamsRequest{RunId: runID})
	if err != nil {
		return nil, fmt.Errorf("ListStreams %s: %w", runID, err)
	}
	return resp.Streams, nil
}
