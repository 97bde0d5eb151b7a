// Package cyclonetest runs a handler or a durable function in a test, with no server:
// the node's journal is kept in memory as the server would keep it, and each attempt
// runs through the worker's own code (the replay of recorded calls, unsafe calls,
// patches, the checks of sizes and order).
//
// A crash can be injected around any step call: the attempt stops there as if the
// worker had died, and the next attempt replays the journal as it was left.
//
//	node, err := cyclonetest.NewNode(fulfil, cyclonetest.RunInput(order))
//	...
//	a, err := node.Run(ctx, cyclonetest.CrashBeforeRecord("charge_card"))  // a.Status == Crashed
//	a, err = node.Run(ctx)                                                   // a.Status == Blocked
//	err = node.ResolveResult("charge_card", Charge{ID: "ch_1"})
//	a, err = node.Run(ctx)                                                   // a.Status == Completed
//	node.Executions("charge_card")                                           // 1
//
// CallInTx needs a real database for its transaction; the rest of a body runs here.
package cyclonetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cyclone-workflows/cyclone/sdk/go/client"
	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
	"github.com/cyclone-workflows/cyclone/sdk/go/internal/testhook"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

// Status is how an attempt ended.
type Status string

const (
	Completed Status = "completed" // the handler returned an output
	Failed    Status = "failed"    // the handler returned an error (see Attempt.Failure)
	Crashed   Status = "crashed"   // the injected crash stopped it; nothing was reported
	Blocked   Status = "blocked"   // an unsafe call begun before has no outcome: see Resolve
	Suspended Status = "suspended" // the body waits (a sleep, an event, a child run): see WaitingOn
	Dropped   Status = "dropped"   // the body stopped for another reason and reported nothing
)

// Attempt is what one run of the node did.
type Attempt struct {
	Number  int
	Status  Status
	Output  *structpb.Value    // Completed: the handler's output
	Failure *cyclonev1.Failure // Failed: the failure as the server would get it
	// The step ids whose function ran in this attempt, in order (a crash before the
	// record included); replayed calls are not in it.
	Ran []string
	// Blocked: the step id of the unsafe call without an outcome.
	BlockedOn string
	// Suspended: the step id of the wait.
	WaitingOn string
	// The log lines the handler sent with its completion.
	Logs []*cyclonev1.LogLine
}

// Decode decodes the attempt's output into v, a pointer as for json.Unmarshal.
func (a Attempt) Decode(v any) error {
	if a.Status != Completed {
		return fmt.Errorf("attempt %d did not complete: %s", a.Number, a.Status)
	}
	return client.Decode(a.Output, v)
}

// Retryable says whether the server would run the node again after this attempt.
func (a Attempt) Retryable() bool {
	switch a.Status {
	case Crashed, Dropped, Suspended:
		return true
	case Failed:
		return !a.Failure.GetNonRetryable()
	}
	return false
}

// Option sets what the node's steps are claimed with.
type Option func(*Node) error

// Input is the node's static input (Step.DecodeInput).
func Input(v any) Option {
	return func(n *Node) (err error) { n.claim.Input, err = client.ToValue(v); return err }
}

// RunInput is the run's input (Step.DecodeRunInput).
func RunInput(v any) Option {
	return func(n *Node) (err error) { n.claim.RunInput, err = client.ToValue(v); return err }
}

// Upstream is the output of the upstream node named node (Step.DecodeUpstream).
func Upstream(node string, v any) Option {
	return func(n *Node) error {
		value, err := client.ToValue(v)
		n.claim.UpstreamOutputs[node] = value
		return err
	}
}

// MaxAttempts is how many attempts RunToEnd makes at most; 3 by default.
func MaxAttempts(max int) Option {
	return func(n *Node) error { n.claim.MaxAttempts = int32(max); return nil }
}

// Limits are the worker's limits (the payload limit, the journal's length).
func Limits(l worker.Limits) Option {
	return func(n *Node) error { n.opts.Limits = l; return nil }
}

// Node is one node of a run whose handler runs here, attempt after attempt, with its
// journal in memory. It is safe to use from one test goroutine.
type Node struct {
	handler worker.Handler
	claim   *cyclonev1.ClaimedStep // the fields every attempt is claimed with
	opts    worker.Options

	mu         sync.Mutex
	attempts   int
	journal    map[string]*cyclonev1.StepCall // by step id
	executions map[string]int
	blockedOn  string
	events     map[string][]*structpb.Value
	children   map[string]*child
	crash      *Crash
	current    *Attempt
	streams    map[string][]string // the chunks emitted, by stream: text, or JSON text
	chunkIDs   map[string]int64    // the offsets of the chunks stored, by identity
}

// NewNode makes a node whose handler is h. An option that cannot be applied (an input
// that is not JSON) is the error.
func NewNode(h worker.Handler, opts ...Option) (*Node, error) {
	if h == nil {
		return nil, errors.New("cyclonetest: no handler")
	}
	n := &Node{
		handler: h,
		claim: &cyclonev1.ClaimedStep{
			RunId: "00000000-0000-7000-8000-000000000001", Node: "node", Action: "test", Workflow: "test",
			MaxAttempts: 3, UpstreamOutputs: map[string]*structpb.Value{},
		},
		opts:       worker.Options{ID: "cyclonetest", Concurrency: 1, Lease: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		journal:    map[string]*cyclonev1.StepCall{},
		executions: map[string]int{},
		events:     map[string][]*structpb.Value{},
		children:   map[string]*child{},
		streams:    map[string][]string{},
		chunkIDs:   map[string]int64{},
	}
	for _, opt := range opts {
		if err := opt(n); err != nil {
			return nil, fmt.Errorf("cyclonetest: %w", err)
		}
	}
	return n, nil
}

// Run runs one attempt of the node from the top, with the journal as the attempts
// before left it, and crash injected if given. A crash point the attempt never
// reached is an error (the attempt ran to its end, and is returned too). A node
// blocked on an unsafe call stays blocked, with no attempt, until it is resolved.
func (n *Node) Run(ctx context.Context, crash ...Crash) (Attempt, error) {
	if len(crash) > 1 {
		return Attempt{}, errors.New("cyclonetest: one crash per attempt")
	}
	if err := ctx.Err(); err != nil {
		return Attempt{}, err
	}
	n.mu.Lock()
	if n.blockedOn != "" {
		n.mu.Unlock()
		return Attempt{Number: n.attempts, Status: Blocked, BlockedOn: n.blockedOn}, nil
	}
	n.attempts++
	n.crash = nil
	if len(crash) == 1 {
		c := crash[0]
		n.crash = &c
	}
	n.current = &Attempt{Number: n.attempts}
	claimed := proto.Clone(n.claim).(*cyclonev1.ClaimedStep)
	claimed.Attempt = int32(n.attempts)
	claimed.LeaseToken = fmt.Sprintf("lease-%d", n.attempts)
	claimed.Deadline = timestamppb.New(time.Now().Add(time.Hour))
	claimed.Journal = n.entries()
	n.mu.Unlock()

	w, err := worker.New(&conn{node: n}, n.opts,
		worker.Action{Name: claimed.Action, Handler: n.handler})
	if err != nil {
		return Attempt{}, fmt.Errorf("cyclonetest: %w", err)
	}
	testhook.RunStep(w, claimed)

	n.mu.Lock()
	defer n.mu.Unlock()
	a := *n.current
	if n.crash != nil && n.crash.reached {
		a.Status, a.Output, a.Failure = Crashed, nil, nil
	}
	if a.Status == "" {
		a.Status = Dropped
		if n.blockedOn != "" {
			a.Status, a.BlockedOn = Blocked, n.blockedOn
		}
	}
	if n.crash != nil && !n.crash.reached {
		return a, fmt.Errorf("cyclonetest: the attempt never reached the crash point %v", *n.crash)
	}
	return a, nil
}

// RunToEnd runs attempts as the server would retry them, until one completes, fails
// for good, blocks, or the node has had MaxAttempts attempts; it returns the last. A
// suspended attempt is run again too (a sleep is over at the next attempt), and
// counts as one.
func (n *Node) RunToEnd(ctx context.Context) (Attempt, error) {
	for {
		a, err := n.Run(ctx)
		if err != nil || !a.Retryable() || a.Number >= int(n.claim.MaxAttempts) {
			return a, err
		}
	}
}

// Executions is how many times the function of the step call stepID ran, over all
// attempts (a run that crashed before its outcome was recorded included).
func (n *Node) Executions(stepID string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.executions[stepID]
}

// Journal is the node's journal as the server would hold it, in call order.
func (n *Node) Journal() []*cyclonev1.StepCall {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.entries()
}

// Entry is the journal's entry of stepID, or nil.
func (n *Node) Entry(stepID string) *cyclonev1.StepCall {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e := n.journal[stepID]; e != nil {
		return proto.Clone(e).(*cyclonev1.StepCall)
	}
	return nil
}

// entries is the journal sorted by seq, copied. n.mu is held.
func (n *Node) entries() []*cyclonev1.StepCall {
	out := make([]*cyclonev1.StepCall, 0, len(n.journal))
	for _, id := range slices.Sorted(maps.Keys(n.journal)) {
		out = append(out, proto.Clone(n.journal[id]).(*cyclonev1.StepCall))
	}
	slices.SortFunc(out, func(a, b *cyclonev1.StepCall) int { return int(a.Seq - b.Seq) })
	return out
}

// BlockedOn is the step id the node is blocked on, or "".
func (n *Node) BlockedOn() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.blockedOn
}

// ResolveResult settles the blocked call stepID as an operator who found that its
// effect happened, with this result: the body gets it as the call's value.
func (n *Node) ResolveResult(stepID string, result any) error {
	value, err := client.ToValue(result)
	if err != nil {
		return fmt.Errorf("cyclonetest: the result: %w", err)
	}
	return n.resolve(stepID, func(e *cyclonev1.StepCall) {
		e.Status, e.Output = cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, value
	})
}

// ResolveError settles the blocked call stepID as failed with message: the body gets
// a *worker.Failure of type EffectFailed.
func (n *Node) ResolveError(stepID, message string) error {
	return n.resolve(stepID, func(e *cyclonev1.StepCall) {
		e.Status = cyclonev1.StepCallStatus_STEP_CALL_STATUS_FAILED
		e.Error = &cyclonev1.StepCallError{Type: "EffectFailed", Message: message}
	})
}

// ResolveDiscard settles the blocked call stepID as never having happened: the next
// attempt runs it again.
func (n *Node) ResolveDiscard(stepID string) error {
	return n.resolve(stepID, nil)
}

func (n *Node) resolve(stepID string, set func(*cyclonev1.StepCall)) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.blockedOn != stepID {
		return fmt.Errorf("cyclonetest: the node is not blocked on %q (blocked on %q)", stepID, n.blockedOn)
	}
	if set == nil {
		delete(n.journal, stepID)
	} else {
		set(n.journal[stepID])
	}
	n.blockedOn = ""
	return nil
}

// Emitted is what the node's handler emitted (Step.Emit) over its attempts, by stream,
// as the server stores it: a chunk emitted again under the same identity (by a replay)
// is there once. Each chunk is its text, or its JSON text.
func (n *Node) Emitted() map[string][]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string][]string, len(n.streams))
	for name, chunks := range n.streams {
		out[name] = append([]string(nil), chunks...)
	}
	return out
}
