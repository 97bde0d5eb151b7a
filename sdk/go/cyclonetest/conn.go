package cyclonetest

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// When is where around a step call a crash happens.
type When int

const (
	// BeforeRecord: the function ran and the worker died before its outcome was
	// recorded. A safe call runs again at the next attempt; an unsafe one blocks it.
	BeforeRecord When = iota
	// AfterRecord: the outcome was recorded and the worker died before it learned so.
	// The next attempt replays it.
	AfterRecord
	// BeforeCall: an unsafe call was recorded STARTED and the worker died before its
	// function ran. The next attempt blocks: nobody knows it did not run.
	BeforeCall
	// AtEnd: the body returned and the worker died before the completion arrived.
	AtEnd
)

func (w When) String() string {
	return [...]string{"before its record", "after its record", "before it ran", "at the end"}[w]
}

// Crash is a crash point of an attempt: around the step call StepID, or at the end.
type Crash struct {
	StepID  string
	When    When
	reached bool
}

func (c Crash) String() string {
	if c.When == AtEnd {
		return "the end of the body"
	}
	return fmt.Sprintf("step call %q, %v", c.StepID, c.When)
}

// CrashBeforeRecord kills the worker after the call stepID ran, before its outcome
// was recorded.
func CrashBeforeRecord(stepID string) Crash { return Crash{StepID: stepID, When: BeforeRecord} }

// CrashAfterRecord kills the worker just after the outcome of stepID was recorded.
func CrashAfterRecord(stepID string) Crash { return Crash{StepID: stepID, When: AfterRecord} }

// CrashBeforeCall kills the worker after the unsafe call stepID was recorded
// STARTED, before it ran.
func CrashBeforeCall(stepID string) Crash { return Crash{StepID: stepID, When: BeforeCall} }

// CrashAtEnd kills the worker after the body returned, before its completion arrived.
func CrashAtEnd() Crash { return Crash{When: AtEnd} }

// A crash seen from the worker: the server stops answering its lease. The worker
// stops the body and reports nothing, as a dead worker would.
var errCrash = status.Error(codes.Aborted, "cyclonetest: the worker crashed here")

// conn is the server of one attempt: it answers the worker's RPCs from the node's
// journal, as the server's journal would.
type conn struct {
	node *Node
}

func (c *conn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "cyclonetest: no streams")
}

func (c *conn) Invoke(_ context.Context, method string, args, reply any, _ ...grpc.CallOption) error {
	var resp proto.Message
	var err error
	n := c.node
	n.mu.Lock()
	defer n.mu.Unlock()
	switch in := args.(type) {
	case *cyclonev1.HeartbeatRequest:
		resp = &cyclonev1.HeartbeatResponse{}
	case *cyclonev1.BeginStepCallRequest:
		resp, err = c.begin(in)
	case *cyclonev1.EndStepCallRequest:
		resp, err = c.end(in)
	case *cyclonev1.CompleteRequest:
		resp, err = c.complete(in)
	case *cyclonev1.WaitRequest:
		resp, err = c.wait(in)
	case *cyclonev1.StartChildRequest:
		resp, err = c.startChild(in)
	case *cyclonev1.EmitChunksRequest:
		resp = c.emit(in)
	default:
		return status.Errorf(codes.Unimplemented, "cyclonetest does not serve %s", method)
	}
	if err != nil {
		return err
	}
	proto.Merge(reply.(proto.Message), resp)
	return nil
}

// crashes says whether the attempt crashes at this point, and marks it reached.
func (c *conn) crashes(stepID string, when When) bool {
	cr := c.node.crash
	if cr == nil || cr.reached || cr.When != when || cr.StepID != stepID {
		return false
	}
	cr.reached = true
	return true
}

func (c *conn) begin(in *cyclonev1.BeginStepCallRequest) (proto.Message, error) {
	n := c.node
	entry := n.journal[in.StepId]
	switch {
	case entry != nil && entry.Status != cyclonev1.StepCallStatus_STEP_CALL_STATUS_STARTED:
		return &cyclonev1.BeginStepCallResponse{Decision: cyclonev1.StepCallDecision_STEP_CALL_DECISION_RECORDED, Call: entry}, nil
	case entry != nil && entry.Attempt != int32(n.current.Number):
		n.blockedOn = in.StepId
		return &cyclonev1.BeginStepCallResponse{Decision: cyclonev1.StepCallDecision_STEP_CALL_DECISION_UNCERTAIN, Call: entry}, nil
	case !in.UnsafeToRepeat: // a safe Begin only reads
		return &cyclonev1.BeginStepCallResponse{Decision: cyclonev1.StepCallDecision_STEP_CALL_DECISION_RUN}, nil
	}
	n.journal[in.StepId] = &cyclonev1.StepCall{StepId: in.StepId, Seq: in.Seq, Function: in.Function,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_STARTED, UnsafeToRepeat: true, Attempt: int32(n.current.Number),
		ArgsDigest: in.ArgsDigest}
	if c.crashes(in.StepId, BeforeCall) {
		return nil, errCrash
	}
	return &cyclonev1.BeginStepCallResponse{Decision: cyclonev1.StepCallDecision_STEP_CALL_DECISION_RUN, Call: n.journal[in.StepId]}, nil
}

func (c *conn) end(in *cyclonev1.EndStepCallRequest) (proto.Message, error) {
	n := c.node
	if in.Function != "cyclone.patch" { // a marker is no function that ran
		n.executions[in.StepId]++
		n.current.Ran = append(n.current.Ran, in.StepId)
	}
	if c.crashes(in.StepId, BeforeRecord) {
		return nil, errCrash
	}
	first := n.journal[in.StepId]
	if first != nil && first.Status != cyclonev1.StepCallStatus_STEP_CALL_STATUS_STARTED {
		return &cyclonev1.EndStepCallResponse{Call: first, Duplicate: true}, nil
	}
	entry := &cyclonev1.StepCall{StepId: in.StepId, Seq: in.Seq, Function: in.Function, UnsafeToRepeat: in.UnsafeToRepeat,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, Output: in.GetOutput(), Attempt: int32(n.current.Number),
		ArgsDigest: in.ArgsDigest}
	if entry.ArgsDigest == "" && first != nil { // an End without one keeps its Begin's
		entry.ArgsDigest = first.ArgsDigest
	}
	if e := in.GetError(); e != nil {
		entry.Status, entry.Output, entry.Error = cyclonev1.StepCallStatus_STEP_CALL_STATUS_FAILED, nil, e
	}
	n.journal[in.StepId] = entry
	if c.crashes(in.StepId, AfterRecord) {
		return nil, errCrash
	}
	return &cyclonev1.EndStepCallResponse{Call: entry}, nil
}

func (c *conn) complete(in *cyclonev1.CompleteRequest) (proto.Message, error) {
	a := c.node.current
	if c.crashes("", AtEnd) {
		return nil, errCrash
	}
	a.Logs = in.Logs
	if failure := in.GetFailure(); failure != nil {
		a.Status, a.Failure = Failed, failure
	} else {
		a.Status, a.Output = Completed, in.GetOutput()
	}
	return &cyclonev1.CompleteResponse{}, nil
}

// emit stores chunks as the server does: by identity, a repeat answered duplicate.
func (c *conn) emit(in *cyclonev1.EmitChunksRequest) proto.Message {
	n := c.node
	resp := &cyclonev1.EmitChunksResponse{}
	for _, chunk := range in.Chunks {
		id := fmt.Sprintf("%s\x00%s\x00%s\x00%d", in.Node, chunk.Stream, chunk.StepId, chunk.Seq)
		offset, dup := n.chunkIDs[id]
		if !dup {
			offset = int64(len(n.streams[chunk.Stream]))
			n.chunkIDs[id] = offset
			n.streams[chunk.Stream] = append(n.streams[chunk.Stream], chunk.GetText()+chunk.GetJson())
		}
		resp.Offsets = append(resp.Offsets, offset)
		resp.Duplicate = append(resp.Duplicate, dup)
	}
	return resp
}
