package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cyclone-workflows/cyclone/sdk/go/client"
	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// A durable function can wait without holding a worker's slot: for a time (Sleep),
// for an event sent to its run (WaitForEvent), or for a child run (StartChild, then
// ChildRun.Result). Each wait is a call of the journal with its own step id. When
// what it waits for is not there yet, the server takes the node's lease back: the
// body is stopped (its context is cancelled with ErrSuspended, and the wait returns
// it), the worker reports nothing and frees the slot, and the node is claimed again
// when it can go on. Its body then replays to the same wait, which answers at once.

// ErrSuspended: the body waits for a time, an event or a child run, and the node has
// given up its lease until then. Return it (or anything: the worker reports nothing).
var ErrSuspended = errors.New("suspended: the node waits and has given up its lease")

const (
	sleepFunction      = "cyclone.sleep"
	eventFunction      = "cyclone.event"
	startChildFunction = "cyclone.start_child"
	childFunction      = "cyclone.child"
	maxEventName       = 200
)

// Sleep waits d, durably: the node gives up its lease and is claimed again once d
// has passed, even on another worker after a restart. The first call fixes the wake
// time; a replay keeps it. Step ids "sleep", "sleep#2"... unless WithStepID names it.
func (s *Step) Sleep(ctx context.Context, d time.Duration, opts ...CallOption) error {
	return s.SleepUntil(ctx, time.Now().Add(d), opts...)
}

// SleepUntil waits until t, as Sleep does.
func (s *Step) SleepUntil(ctx context.Context, t time.Time, opts ...CallOption) error {
	if s == nil {
		return errOutside("SleepUntil")
	}
	_, err := s.wait(ctx, sleepFunction, "sleep", opts, func(r *cyclonev1.WaitRequest) {
		r.Until = &cyclonev1.WaitRequest_WakeAt{WakeAt: timestamppb.New(t)}
	})
	return err
}

// WaitForEvent waits for the event name sent to the run (client.SendEvent) and
// returns its payload decoded into T. Each event is consumed by one wait. With a
// timeout (0: none), the wait fails after it with a *Failure of type EventTimeout,
// recorded: a replay fails the same way. Step ids "event:<name>", "event:<name>#2"...
// unless WithStepID names it.
func WaitForEvent[T any](ctx context.Context, s *Step, name string, timeout time.Duration, opts ...CallOption) (T, error) {
	var zero T
	if s == nil {
		return zero, errOutside("WaitForEvent")
	}
	if err := checkName("event name", name, maxEventName); err != nil {
		return zero, s.stop(fatal("InvalidEventName", "%v", err))
	}
	c, err := s.wait(ctx, eventFunction, "event:"+name, opts, func(r *cyclonev1.WaitRequest) {
		event := &cyclonev1.EventWait{Name: name}
		if timeout > 0 {
			event.Timeout = durationpb.New(timeout)
		}
		r.Until = &cyclonev1.WaitRequest_Event{Event: event}
	})
	return replayed[T](c, err)
}

// ChildRun is a child run started by a durable function.
type ChildRun struct {
	RunID  string
	stepID string
	step   *Step
}

// ChildOutcome is a finished child run: its status ("completed") and the output of
// each of its nodes, to decode with json.Unmarshal.
type ChildOutcome struct {
	RunID   string                     `json:"run_id"`
	Status  string                     `json:"status"`
	Outputs map[string]json.RawMessage `json:"outputs"`
}

// StartChild starts a child run of wf with input, as a call of the journal: a replay
// gets the same child back and never starts a second one. Cancelling this run
// cancels the child. Step ids "child", "child#2"... unless WithStepID names it.
func (s *Step) StartChild(ctx context.Context, wf *client.Workflow, input any, opts ...CallOption) (*ChildRun, error) {
	if s == nil {
		return nil, errOutside("StartChild")
	}
	if wf == nil {
		return nil, s.stop(fatal("StepCallError", "StartChild: no workflow"))
	}
	workflow, err := wf.Proto()
	if err == nil {
		_, err = client.ToValue(input)
	}
	if err != nil {
		return nil, s.stop(fatal("StepCallError", "StartChild: %v", err))
	}
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	c, err := s.open(startChildFunction, "child", o)
	if err != nil {
		return nil, err
	}
	if c.recorded == nil {
		value, _ := client.ToValue(input)
		req := &cyclonev1.StartChildRequest{RunId: s.RunId, Node: s.Node, LeaseToken: s.LeaseToken,
			StepId: c.id, Seq: c.seq, Workflow: workflow, Input: value}
		resp, err := retryUnavailable(ctx, func(ctx context.Context) (*cyclonev1.StartChildResponse, error) {
			return s.client.StartChild(ctx, req)
		})
		if err != nil {
			return nil, s.refused("StartChild", c, err)
		}
		c = c.remember(resp.Call)
	}
	started, err := replayed[struct {
		RunID string `json:"run_id"`
	}](c, nil)
	if err != nil {
		return nil, err
	}
	if started.RunID == "" {
		return nil, s.stop(fatal("ReplayMismatch", "step call %s is recorded as %v with no child run id", c.id, c.recorded.GetStatus()))
	}
	return &ChildRun{RunID: started.RunID, stepID: c.id, step: s}, nil
}

// Result waits for the child run to finish, without holding a slot, and returns its
// outcome. A child that failed or was cancelled is a *Failure of type ChildFailed or
// ChildCancelled, recorded. The wait's step id is the start's with ".result".
func (r *ChildRun) Result(ctx context.Context) (ChildOutcome, error) {
	c, err := r.step.wait(ctx, childFunction, r.stepID+".result", []CallOption{WithStepID(r.stepID + ".result")},
		func(req *cyclonev1.WaitRequest) { req.Until = &cyclonev1.WaitRequest_ChildRunId{ChildRunId: r.RunID} })
	return replayed[ChildOutcome](c, err)
}

// wait opens a wait of the journal and answers it: from the claimed journal when it
// has an outcome there, else with the Wait RPC, which answers READY with the outcome
// or SUSPENDED (the body is stopped with ErrSuspended).
func (s *Step) wait(ctx context.Context, function, base string, opts []CallOption, until func(*cyclonev1.WaitRequest)) (*stepCall, error) {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	c, err := s.open(function, base, o)
	if err != nil {
		return nil, err
	}
	// A journal point: the updates sent to the node apply before the wait is asked
	// (the node holds its lease until then) or its recorded outcome returns, so that a
	// replay applies them at the same point; the ones sent meanwhile are fetched first.
	over := isOver(c.recorded)
	if !over {
		s.fetchUpdates(ctx)
	}
	if err := s.updatesPoint(ctx); err != nil {
		return nil, err
	}
	if over {
		return c, nil
	}
	if s.handlers != nil && s.inbox != nil {
		// The node may give up its lease with the wait: its queries' values are then
		// answered from what it published, which must be stored first.
		s.inbox.flush()
	}
	req := &cyclonev1.WaitRequest{RunId: s.RunId, Node: s.Node, LeaseToken: s.LeaseToken, StepId: c.id, Seq: c.seq,
		Logs: s.logs.take()}
	until(req)
	resp, err := retryUnavailable(ctx, func(ctx context.Context) (*cyclonev1.WaitResponse, error) {
		return s.client.Wait(ctx, req)
	})
	if err != nil {
		s.logs.giveBack(req.Logs)
		return nil, s.refused("Wait", c, err)
	}
	switch resp.Decision {
	case cyclonev1.WaitDecision_WAIT_DECISION_READY:
		return c.remember(resp.Call), nil
	case cyclonev1.WaitDecision_WAIT_DECISION_SUSPENDED:
		return nil, s.stop(fmt.Errorf("%w (%s)", ErrSuspended, c.id))
	}
	return nil, fmt.Errorf("the Wait for %s: unknown decision %v", c.id, resp.Decision)
}

func errOutside(what string) error {
	return fmt.Errorf("worker: %s works inside a durable function's handler (a *Step from the worker)", what)
}
