// Package client submits workflows to a Cyclone server and watches, cancels, retries
// and resolves their runs: WorkflowService and AdminService behind plain Go calls.
//
// Every method takes a context.Context first and returns the server's refusal as an
// error that wraps the gRPC status (status.Code(err) reads it) and names the call:
// "GetRun: rpc error: code = NotFound desc = ...". A value that cannot be encoded as
// JSON is an error before anything is sent.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// DefaultAddress is the address of a server started with make run.
const DefaultAddress = "127.0.0.1:50051"

// Dial makes a connection to a Cyclone server that reconnects within seconds when the
// server restarts (gRPC's own backoff grows to two minutes). Without options it is
// plaintext; pass grpc.WithTransportCredentials for TLS, and
// grpc.WithPerRPCCredentials for a token. The connection is lazy: an unreachable
// server shows as an UNAVAILABLE error of the first call, not here.
func Dial(address string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	all := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: 5 * time.Second},
		}),
	}
	conn, err := grpc.NewClient(address, append(all, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("cyclone server %s: %w", address, err)
	}
	return conn, nil
}

// Client calls a Cyclone server. It is safe for concurrent use.
type Client struct {
	workflows cyclonev1.WorkflowServiceClient
	admin     cyclonev1.AdminServiceClient
}

// New makes a client on a connection (from Dial, or any gRPC connection).
func New(conn grpc.ClientConnInterface) *Client {
	return &Client{
		workflows: cyclonev1.NewWorkflowServiceClient(conn),
		admin:     cyclonev1.NewAdminServiceClient(conn),
	}
}

// SubmitOption changes a submission.
type SubmitOption func(*submitOptions)

type submitOptions struct {
	startAt  time.Time
	priority int32
}

// StartAt holds the run until t; its first steps become ready then.
func StartAt(t time.Time) SubmitOption { return func(o *submitOptions) { o.startAt = t } }

// Priority orders the run's steps against others of the same action: higher first.
func Priority(p int) SubmitOption { return func(o *submitOptions) { o.priority = int32(p) } }

func (o *submitOptions) apply(opts []SubmitOption) *submitOptions {
	for _, opt := range opts {
		opt(o)
	}
	return o
}

func (o *submitOptions) start() *timestamppb.Timestamp {
	if o.startAt.IsZero() {
		return nil
	}
	return timestamppb.New(o.startAt)
}

// Submit starts a run of the workflow with input (any JSON-encodable value, or nil)
// and returns its id.
func (c *Client) Submit(ctx context.Context, wf *Workflow, input any, opts ...SubmitOption) (string, error) {
	proto, value, err := prepare(wf, input)
	if err != nil {
		return "", fmt.Errorf("Submit: %w", err)
	}
	o := new(submitOptions).apply(opts)
	resp, err := c.workflows.Submit(ctx, &cyclonev1.SubmitRequest{
		Workflow: proto, Input: value, StartAt: o.start(), Priority: o.priority,
	})
	if err != nil {
		return "", fmt.Errorf("Submit: %w", err)
	}
	return resp.RunId, nil
}

// SubmitOnce starts a run unless one was submitted with the same key (an order id, a
// request id): then it returns that run's id and created is false. Repeating it after
// a lost answer never starts two runs.
func (c *Client) SubmitOnce(ctx context.Context, wf *Workflow, key string, input any, opts ...SubmitOption) (runID string, created bool, err error) {
	if key == "" {
		return "", false, errors.New("SubmitOnce: the key is empty")
	}
	proto, value, err := prepare(wf, input)
	if err != nil {
		return "", false, fmt.Errorf("SubmitOnce: %w", err)
	}
	o := new(submitOptions).apply(opts)
	resp, err := c.workflows.SubmitOnce(ctx, &cyclonev1.SubmitOnceRequest{
		Workflow: proto, Input: value, Key: key, StartAt: o.start(), Priority: o.priority,
	})
	if err != nil {
		return "", false, fmt.Errorf("SubmitOnce: %w", err)
	}
	return resp.RunId, resp.Created, nil
}

func prepare(wf *Workflow, input any) (*cyclonev1.Workflow, *structpb.Value, error) {
	if wf == nil {
		return nil, nil, errors.New("no workflow")
	}
	proto, err := wf.Proto()
	if err != nil {
		return nil, nil, err
	}
	value, err := ToValue(input)
	if err != nil {
		return nil, nil, fmt.Errorf("the input: %w", err)
	}
	return proto, value, nil
}

// GetRun returns the run with its steps and their audit trail. With logs, each
// step's log lines come too (Step.Logs).
func (c *Client) GetRun(ctx context.Context, runID string, logs bool) (*cyclonev1.Run, error) {
	resp, err := c.workflows.GetRun(ctx, &cyclonev1.GetRunRequest{RunId: runID, Logs: logs})
	if err != nil {
		return nil, fmt.Errorf("GetRun %s: %w", runID, err)
	}
	return resp.Run, nil
}

// Settled says whether nothing but an operator moves the run any more: completed,
// failed, cancelled, or blocked (waiting for Resolve).
func Settled(run *cyclonev1.Run) bool {
	switch run.GetStatus() {
	case cyclonev1.RunStatus_RUN_STATUS_COMPLETED, cyclonev1.RunStatus_RUN_STATUS_FAILED,
		cyclonev1.RunStatus_RUN_STATUS_CANCELLED, cyclonev1.RunStatus_RUN_STATUS_BLOCKED:
		return true
	}
	return false
}

// Wait polls the run until it is settled (see Settled) and returns it; a blocked run
// is returned too, since only an operator moves it. It polls quickly at first and
// then every second. Bound it with ctx: when ctx ends first, the error wraps
// ctx's.
func (c *Client) Wait(ctx context.Context, runID string) (*cyclonev1.Run, error) {
	delay := 20 * time.Millisecond
	for {
		run, err := c.GetRun(ctx, runID, false)
		if err != nil {
			return nil, err
		}
		if Settled(run) {
			return run, nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for run %s (%s): %w", runID, run.Status, context.Cause(ctx))
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}

// ListRuns returns a page of runs, newest first, as the request filters them; pass
// the answer's NextPageToken back for the next page.
func (c *Client) ListRuns(ctx context.Context, req *cyclonev1.ListRunsRequest) (*cyclonev1.ListRunsResponse, error) {
	resp, err := c.workflows.ListRuns(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("ListRuns: %w", err)
	}
	return resp, nil
}

// Cancel cancels an unfinished run; its running handlers learn it at their next
// heartbeat (their context ends with worker.ErrRunCancelled). Its child runs are
// cancelled with it.
func (c *Client) Cancel(ctx context.Context, runID, reason string) (*cyclonev1.Run, error) {
	resp, err := c.workflows.CancelRun(ctx, &cyclonev1.CancelRunRequest{RunId: runID, Reason: reason})
	if err != nil {
		return nil, fmt.Errorf("CancelRun %s: %w", runID, err)
	}
	return resp.Run, nil
}

// Explain says why a node of a run is where it is (waiting on upstream, backing off,
// no worker serving its action...).
func (c *Client) Explain(ctx context.Context, runID, node string) (*cyclonev1.ExplainResponse, error) {
	resp, err := c.workflows.Explain(ctx, &cyclonev1.ExplainRequest{RunId: runID, Node: node})
	if err != nil {
		return nil, fmt.Errorf("Explain %s %s: %w", runID, node, err)
	}
	return resp, nil
}

// SendEvent sends the event name with a JSON payload to a run, where a wait for it
// consumes it (worker.WaitForEvent in a body, or a node with an event). With a key,
// a repeat sends nothing and created is false.
func (c *Client) SendEvent(ctx context.Context, runID, name string, payload any, key string) (created bool, err error) {
	value, err := ToValue(payload)
	if err != nil {
		return false, fmt.Errorf("SendEvent %s: the payload: %w", name, err)
	}
	resp, err := c.workflows.SendEvent(ctx, &cyclonev1.SendEventRequest{RunId: runID, Name: name, Payload: value, Key: key})
	if err != nil {
		return false, fmt.Errorf("SendEvent %s to %s: %w", name, runID, err)
	}
	return resp.Created, nil
}

// Retry reopens a discarded node in place: the same run and node, the next attempt.
func (c *Client) Retry(ctx context.Context, runID, node, reason string) (*cyclonev1.Run, error) {
	resp, err := c.admin.Retry(ctx, &cyclonev1.RetryRequest{RunId: runID, Node: node, Reason: reason})
	if err != nil {
		return nil, fmt.Errorf("Retry %s %s: %w", runID, node, err)
	}
	return resp.Run, nil
}

// Resolution is what an operator decides for the uncertain effect of a blocked run:
// ResolveResult, ResolveError or ResolveDiscard.
type Resolution struct {
	set func(*cyclonev1.ResolveRequest) error
}

// ResolveResult says that the effect happened, with this result (JSON-encodable): a
// durable function's body goes on with it as the call's value.
func ResolveResult(result any) Resolution {
	return Resolution{func(r *cyclonev1.ResolveRequest) error {
		value, err := ToValue(result)
		if err != nil {
			return fmt.Errorf("the result: %w", err)
		}
		r.Resolution = &cyclonev1.ResolveRequest_Result{Result: value}
		return nil
	}}
}

// ResolveError says that the effect failed, with this message: the call fails.
func ResolveError(message string) Resolution {
	return Resolution{func(r *cyclonev1.ResolveRequest) error {
		r.Resolution = &cyclonev1.ResolveRequest_Error{Error: message}
		return nil
	}}
}

// ResolveDiscard says that the effect did not happen: the call runs again.
func ResolveDiscard() Resolution {
	return Resolution{func(r *cyclonev1.ResolveRequest) error {
		r.Resolution = &cyclonev1.ResolveRequest_Discard{Discard: true}
		return nil
	}}
}

// Resolve settles the uncertain effect of a blocked run: target is the node, or the
// step id of a durable function's step call.
func (c *Client) Resolve(ctx context.Context, runID, target string, resolution Resolution, reason string) (*cyclonev1.Run, error) {
	if resolution.set == nil {
		return nil, errors.New("Resolve: no resolution (use ResolveResult, ResolveError or ResolveDiscard)")
	}
	req := &cyclonev1.ResolveRequest{RunId: runID, Node: target, Reason: reason}
	if err := resolution.set(req); err != nil {
		return nil, fmt.Errorf("Resolve %s %s: %w", runID, target, err)
	}
	resp, err := c.admin.Resolve(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("Resolve %s %s: %w", runID, target, err)
	}
	return resp.Run, nil
}

// ToValue turns a JSON-encodable Go value into a google.protobuf.Value; nil is null.
func ToValue(v any) (*structpb.Value, error) {
	if v == nil {
		return structpb.NewNullValue(), nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	out := &structpb.Value{}
	if err := protojson.Unmarshal(raw, out); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	return out, nil
}

// Decode decodes a google.protobuf.Value (a run's output, a step's) into v, a
// pointer as for json.Unmarshal.
func Decode(in *structpb.Value, v any) error {
	if in == nil {
		in = structpb.NewNullValue()
	}
	raw, err := protojson.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, v)
}
