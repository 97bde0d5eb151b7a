package cyclonetest_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/cyclone-workflows/cyclone/sdk/go/client"
	"github.com/cyclone-workflows/cyclone/sdk/go/cyclonetest"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

// approval sleeps, waits for an approval event (or times out), starts a shipment as
// a child run and returns what the child's node "ship" produced.
func approval(ctx context.Context, step *worker.Step) (any, error) {
	if err := step.Sleep(ctx, time.Hour); err != nil {
		return nil, err
	}
	type decision struct {
		Approved bool `json:"approved"`
	}
	d, err := worker.WaitForEvent[decision](ctx, step, "approval", 24*time.Hour)
	var failure *worker.Failure
	if errors.As(err, &failure) && failure.Type == "EventTimeout" {
		return map[string]any{"status": "expired"}, nil
	}
	if err != nil {
		return nil, err
	}
	if !d.Approved {
		return map[string]any{"status": "rejected"}, nil
	}
	shipment, err := step.StartChild(ctx, client.NewWorkflow("shipment").Node("ship", "ship"), map[string]string{"to": "Lyon"})
	if err != nil {
		return nil, err
	}
	outcome, err := shipment.Result(ctx)
	if err != nil {
		return nil, err
	}
	var tracking string
	if err := json.Unmarshal(outcome.Outputs["ship"], &tracking); err != nil {
		return nil, err
	}
	return map[string]any{"status": "shipped", "tracking": tracking, "child": outcome.RunID}, nil
}

func TestWaitsSuspendTheNodeAndReplayToTheSamePlace(t *testing.T) {
	node, err := cyclonetest.NewNode(approval)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		before  func() error
		waiting string
	}{
		{nil, "sleep"},
		{nil, "event:approval"}, // the hour has passed; no event yet
		{func() error { return node.SendEvent("approval", map[string]bool{"approved": true}) }, "child.result"},
		{nil, "child.result"}, // the child still runs
	}
	for i, s := range steps {
		if s.before != nil {
			if err := s.before(); err != nil {
				t.Fatal(err)
			}
		}
		a := run(t, node)
		if a.Status != cyclonetest.Suspended || a.WaitingOn != s.waiting {
			t.Fatalf("attempt %d: %s on %q; want suspended on %q (%v)", i+1, a.Status, a.WaitingOn, s.waiting, a.Failure)
		}
	}
	if children := node.Children(); len(children) != 1 || children["child-1"] != "shipment" {
		t.Fatalf("children %v", children)
	}
	if err := node.FinishChild("child-1", map[string]any{"ship": "TRK-1"}); err != nil {
		t.Fatal(err)
	}
	a := run(t, node)
	var out map[string]string
	if err := a.Decode(&out); err != nil || out["status"] != "shipped" || out["tracking"] != "TRK-1" || out["child"] != "child-1" {
		t.Fatalf("%v %v", out, err)
	}
	if len(node.Children()) != 1 {
		t.Fatal("a replay started a second child")
	}
}

func TestAnEventWaitThatTimesOutIsARecordedFailure(t *testing.T) {
	node, _ := cyclonetest.NewNode(approval)
	run(t, node) // sleeping
	run(t, node) // waiting for the event
	if err := node.ExpireWait("event:approval"); err != nil {
		t.Fatal(err)
	}
	var out map[string]string
	if err := run(t, node).Decode(&out); err != nil || out["status"] != "expired" {
		t.Fatalf("%v %v", out, err)
	}
	if err := node.FinishChild("child-1", nil); err == nil {
		t.Fatal("finished a child that was never started")
	}
}

func TestWaitsOutsideADurableFunctionAreAnError(t *testing.T) {
	var s *worker.Step
	if err := s.Sleep(context.Background(), time.Second); err == nil {
		t.Fatal("Sleep outside a body")
	}
	if _, err := worker.WaitForEvent[int](context.Background(), nil, "x", 0); err == nil {
		t.Fatal("WaitForEvent outside a body")
	}
}
