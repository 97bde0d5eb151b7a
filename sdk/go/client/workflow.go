package client

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// Workflow is a DAG of nodes, each calling an action that workers serve:
//
//	wf := client.NewWorkflow("checkout").
//		Node("price", "checkout.price").
//		Node("charge", "checkout.charge", client.After("price"), client.Retry(3))
//
// A node option that cannot be applied (an input that is not JSON) is kept as an
// error that Proto, Submit and SubmitOnce return.
type Workflow struct {
	name  string
	nodes []*cyclonev1.Node
	err   error
}

// NewWorkflow starts a workflow called name.
func NewWorkflow(name string) *Workflow { return &Workflow{name: name} }

// NodeOption sets a field of a node.
type NodeOption func(*cyclonev1.Node) error

// Node adds a node that calls action.
func (w *Workflow) Node(name, action string, opts ...NodeOption) *Workflow {
	n := &cyclonev1.Node{Name: name, Action: action}
	for _, opt := range opts {
		if err := opt(n); err != nil && w.err == nil {
			w.err = fmt.Errorf("node %s: %w", name, err)
		}
	}
	w.nodes = append(w.nodes, n)
	return w
}

// Proto is the workflow as the server takes it, or the first error of its options.
func (w *Workflow) Proto() (*cyclonev1.Workflow, error) {
	if w.err != nil {
		return nil, w.err
	}
	if w.name == "" || len(w.nodes) == 0 {
		return nil, errors.New("a workflow needs a name and at least one node")
	}
	return &cyclonev1.Workflow{Name: w.name, Nodes: w.nodes}, nil
}

// After makes the node wait for these upstream nodes.
func After(nodes ...string) NodeOption {
	return func(n *cyclonev1.Node) error { n.DependsOn = append(n.DependsOn, nodes...); return nil }
}

// Input is the node's static input (JSON-encodable), which its handler reads with
// Step.DecodeInput.
func Input(v any) NodeOption {
	return func(n *cyclonev1.Node) error {
		value, err := ToValue(v)
		if err != nil {
			return fmt.Errorf("the input: %w", err)
		}
		n.Input = value
		return nil
	}
}

// Timeout bounds each attempt of the node: its handler's context ends then.
func Timeout(d time.Duration) NodeOption {
	return func(n *cyclonev1.Node) error { n.Timeout = durationpb.New(d); return nil }
}

// Retry gives the node at most maxAttempts attempts, with the server's default
// backoff; RetryPolicy sets the rest.
func Retry(maxAttempts int) NodeOption {
	return func(n *cyclonev1.Node) error {
		if n.Retry == nil {
			n.Retry = &cyclonev1.RetryPolicy{}
		}
		n.Retry.MaxAttempts = int32(maxAttempts)
		return nil
	}
}

// RetryPolicy sets the node's whole retry policy.
func RetryPolicy(p *cyclonev1.RetryPolicy) NodeOption {
	return func(n *cyclonev1.Node) error { n.Retry = p; return nil }
}

// TriggerRule sets when the node runs with respect to its upstream nodes' outcomes.
func TriggerRule(rule cyclonev1.TriggerRule) NodeOption {
	return func(n *cyclonev1.Node) error { n.TriggerRule = rule; return nil }
}

// WaitForEvent makes the node wait for the event name (SendEvent) before it runs.
func WaitForEvent(name string, timeout time.Duration) NodeOption {
	return func(n *cyclonev1.Node) error {
		n.Event = &cyclonev1.EventWait{Name: name}
		if timeout > 0 {
			n.Event.Timeout = durationpb.New(timeout)
		}
		return nil
	}
}
