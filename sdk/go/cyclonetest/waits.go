package cyclonetest

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/cyclone-workflows/cyclone/sdk/go/client"
	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// Waits in a test: time is not real here. A sleep suspends the attempt that reaches
// it and is over at the next one. An event wait suspends until SendEvent sent its
// event (or ExpireWait timed it out); a child run's wait suspends until FinishChild or
// FailChild ended the child that StartChild recorded.

// child is a child run that a body started.
type child struct {
	workflow string
	input    *structpb.Value
	outcome  *cyclonev1.StepCall // nil while it runs: the wait's entry once it ended
}

// SendEvent sends the event name with payload to the node's run, for a wait to
// consume.
func (n *Node) SendEvent(name string, payload any) error {
	value, err := client.ToValue(payload)
	if err != nil {
		return fmt.Errorf("cyclonetest: the payload: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.events[name] = append(n.events[name], value)
	return nil
}

// ExpireWait makes the event wait stepID time out: its next answer is a failure of
// type EventTimeout.
func (n *Node) ExpireWait(stepID string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	e := n.journal[stepID]
	if e == nil || e.Function != "cyclone.event" || e.Status != cyclonev1.StepCallStatus_STEP_CALL_STATUS_WAITING {
		return fmt.Errorf("cyclonetest: no event wait %q is waiting", stepID)
	}
	e.Status = cyclonev1.StepCallStatus_STEP_CALL_STATUS_FAILED
	e.Error = &cyclonev1.StepCallError{Type: "EventTimeout", Message: "the event did not come in time"}
	return nil
}

// Children are the child runs the body started: run id to workflow name.
func (n *Node) Children() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]string, len(n.children))
	for id, c := range n.children {
		out[id] = c.workflow
	}
	return out
}

// FinishChild completes the child run runID with the outputs of its nodes.
func (n *Node) FinishChild(runID string, outputs map[string]any) error {
	value, err := client.ToValue(map[string]any{"run_id": runID, "status": "completed", "outputs": outputs})
	if err != nil {
		return fmt.Errorf("cyclonetest: the outputs: %w", err)
	}
	return n.endChild(runID, &cyclonev1.StepCall{Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, Output: value})
}

// FailChild fails the child run runID with message: its wait fails with ChildFailed.
func (n *Node) FailChild(runID, message string) error {
	return n.endChild(runID, &cyclonev1.StepCall{Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_FAILED,
		Error: &cyclonev1.StepCallError{Type: "ChildFailed", Message: message}})
}

func (n *Node) endChild(runID string, outcome *cyclonev1.StepCall) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.children[runID]
	if c == nil {
		return fmt.Errorf("cyclonetest: the body started no child run %q", runID)
	}
	c.outcome = outcome
	return nil
}

func (c *conn) startChild(in *cyclonev1.StartChildRequest) (proto.Message, error) {
	n := c.node
	if e := n.journal[in.StepId]; e != nil {
		var started struct {
			RunID string `json:"run_id"`
		}
		_ = client.Decode(e.Output, &started)
		return &cyclonev1.StartChildResponse{ChildRunId: started.RunID, Call: e}, nil
	}
	runID := fmt.Sprintf("child-%d", len(n.children)+1)
	n.children[runID] = &child{workflow: in.Workflow.GetName(), input: in.Input}
	output, _ := client.ToValue(map[string]string{"run_id": runID})
	e := &cyclonev1.StepCall{StepId: in.StepId, Seq: in.Seq, Function: "cyclone.start_child",
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, Output: output, Attempt: int32(n.current.Number)}
	n.journal[in.StepId] = e
	return &cyclonev1.StartChildResponse{ChildRunId: runID, Created: true, Call: e}, nil
}

func (c *conn) wait(in *cyclonev1.WaitRequest) (proto.Message, error) {
	n := c.node
	e := n.journal[in.StepId]
	if e == nil {
		e = &cyclonev1.StepCall{StepId: in.StepId, Seq: in.Seq, Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_WAITING,
			Attempt: int32(n.current.Number)}
		n.journal[in.StepId] = e
	}
	if e.Status == cyclonev1.StepCallStatus_STEP_CALL_STATUS_WAITING {
		switch until := in.Until.(type) {
		case *cyclonev1.WaitRequest_WakeAt:
			e.Function = "cyclone.sleep"
			if e.Attempt != int32(n.current.Number) { // an attempt later: the time has come
				e.Status = cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED
				e.Output = structpb.NewNullValue()
			}
		case *cyclonev1.WaitRequest_Event:
			e.Function = "cyclone.event"
			if queue := n.events[until.Event.Name]; len(queue) > 0 {
				e.Status, e.Output = cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, queue[0]
				n.events[until.Event.Name] = queue[1:]
			}
		case *cyclonev1.WaitRequest_ChildRunId:
			e.Function = "cyclone.child"
			if ch := n.children[until.ChildRunId]; ch != nil && ch.outcome != nil {
				e.Status, e.Output, e.Error = ch.outcome.Status, ch.outcome.Output, ch.outcome.Error
			}
		}
	}
	if e.Status == cyclonev1.StepCallStatus_STEP_CALL_STATUS_WAITING {
		n.current.Status, n.current.WaitingOn = Suspended, in.StepId
		return &cyclonev1.WaitResponse{Decision: cyclonev1.WaitDecision_WAIT_DECISION_SUSPENDED, Call: e}, nil
	}
	return &cyclonev1.WaitResponse{Decision: cyclonev1.WaitDecision_WAIT_DECISION_READY, Call: e}, nil
}
