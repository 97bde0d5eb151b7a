package client

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// Queries and updates of durable functions (docs/durable-functions.md, "Queries and
// updates"): a query reads a value from a body's query handler, an update changes
// the body through its update handler, applied at the body's next journal point and
// recorded in its journal.

// The longest waits the server takes for QueryRun and UpdateRun.
const (
	maxQueryWait  = 60 * time.Second
	maxUpdateWait = 300 * time.Second
)

// QueryAnswer is a query handler's value.
type QueryAnswer struct {
	// The value, as JSON text: json.Unmarshal it, or use Decode.
	Result json.RawMessage
	// True when no worker ran the body and the value is the one it last published
	// (at PublishedAt); false when the worker running the body answered.
	Published   bool
	PublishedAt time.Time
}

// Decode decodes the value into v (a pointer, as for json.Unmarshal).
func (a *QueryAnswer) Decode(v any) error { return json.Unmarshal(a.Result, v) }

// UpdateResult is the outcome of an update the body applied.
type UpdateResult struct {
	// The update handler's return value, as JSON text; see Decode.
	Result json.RawMessage
	// The update's id: the one given (WithUpdateID), or the one the server made.
	UpdateID string
	// False when the id named an update sent before: this call sent nothing, and the
	// result is that update's.
	Created bool
	// The journal position (seq) at which the body applied it.
	Seq int32
}

// Decode decodes the result into v (a pointer, as for json.Unmarshal).
func (r *UpdateResult) Decode(v any) error { return json.Unmarshal(r.Result, v) }

// Query asks the query handler name of the durable function running node, with JSON
// args (nil: none). The worker running the body answers it (read-only, nothing is
// journaled); when none runs it, the answer is the value the body last published
// (Published true; only handlers without arguments publish). The wait for the
// worker's answer is ctx's deadline, at most 60s (none: the server's 10s).
//
// Refusals, as status.Code(err): NotFound for an unknown run or node or a handler the
// body does not have; FailedPrecondition when nothing can answer, or the handler
// failed (its type and message); DeadlineExceeded when the worker did not answer.
func (c *Client) Query(ctx context.Context, runID, node, name string, args []any) (*QueryAnswer, error) {
	values, err := listValue(args)
	if err != nil {
		return nil, fmt.Errorf("QueryRun %s: %w", name, err)
	}
	resp, err := c.workflows.QueryRun(ctx, &cyclonev1.QueryRunRequest{
		RunId: runID, Node: node, Name: name, Args: values, Timeout: wait(ctx, maxQueryWait),
	})
	if err != nil {
		return nil, fmt.Errorf("QueryRun %s of %s %s: %w", name, runID, node, err)
	}
	answer := &QueryAnswer{Published: resp.Published}
	if resp.PublishedAt != nil {
		answer.PublishedAt = resp.PublishedAt.AsTime()
	}
	if answer.Result, err = rawJSON(resp.Result); err != nil {
		return nil, fmt.Errorf("QueryRun %s of %s %s: %w", name, runID, node, err)
	}
	return answer, nil
}

// UpdateOption changes an update.
type UpdateOption func(*cyclonev1.UpdateRunRequest)

// WithUpdateID is the update's idempotency key (1-150 printable characters, unique per
// node): calling again with it sends nothing and returns the first update's outcome.
// Without it the server makes one (UpdateResult.UpdateID).
func WithUpdateID(id string) UpdateOption {
	return func(r *cyclonev1.UpdateRunRequest) { r.UpdateId = id }
}

// Update sends the update name with JSON args (nil: none) to the durable function
// running node and waits until its body applied it: its update handler runs at the
// body's next journal point (a step call's return, a wait; a waiting node is woken
// for it), and the application is recorded in the journal (step id
// "update:<update id>"), so it is applied once, also across crashes. The wait is
// ctx's deadline, at most 300s (none: the server's 30s).
//
// Refusals, as status.Code(err): FailedPrecondition when the handler failed (its type
// and message) or the run or node is finished; NotFound for an unknown run or node or
// a handler the body does not have; AlreadyExists when the update id was used for
// another name or other args; DeadlineExceeded when it was not applied in time (it
// stays recorded: call again WithUpdateID the same id for its outcome).
func (c *Client) Update(ctx context.Context, runID, node, name string, args []any, opts ...UpdateOption) (*UpdateResult, error) {
	values, err := listValue(args)
	if err != nil {
		return nil, fmt.Errorf("UpdateRun %s: %w", name, err)
	}
	req := &cyclonev1.UpdateRunRequest{RunId: runID, Node: node, Name: name, Args: values, Timeout: wait(ctx, maxUpdateWait)}
	for _, opt := range opts {
		opt(req)
	}
	resp, err := c.workflows.UpdateRun(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("UpdateRun %s of %s %s: %w", name, runID, node, err)
	}
	result := &UpdateResult{UpdateID: resp.UpdateId, Created: resp.Created, Seq: resp.Seq}
	if result.Result, err = rawJSON(resp.Result); err != nil {
		return nil, fmt.Errorf("UpdateRun %s of %s %s: %w", name, runID, node, err)
	}
	return result, nil
}

// wait is how long the server may wait for an answer: what is left of ctx's deadline,
// at most longest; nil (the server's default) without a deadline.
func wait(ctx context.Context, longest time.Duration) *durationpb.Duration {
	deadline, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	return durationpb.New(min(max(time.Until(deadline), time.Millisecond), longest))
}

func listValue(args []any) (*structpb.ListValue, error) {
	out := &structpb.ListValue{}
	for i, arg := range args {
		value, err := ToValue(arg)
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i+1, err)
		}
		out.Values = append(out.Values, value)
	}
	return out, nil
}

func rawJSON(v *structpb.Value) (json.RawMessage, error) {
	if v == nil {
		return json.RawMessage("null"), nil
	}
	raw, err := protojson.Marshal(v)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(raw), nil
}
