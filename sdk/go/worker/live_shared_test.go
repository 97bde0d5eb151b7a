package worker_test

import (
	"context"
	"os"
	"reflect"
	"sync"
	"testing"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

// sharedCart is the body of tests/test_sdk_go_live.py's Python "shared_cart", in Go:
// a cart filled by updates, an approval, then the event "checkout".
func sharedCart(sent *int) worker.Handler {
	return func(ctx context.Context, step *worker.Step) (any, error) {
		var user string
		if err := step.DecodeRunInput(&user); err != nil {
			return nil, worker.NonRetryable("BadInput", err)
		}
		var mu sync.Mutex
		items := []string{}
		err := step.Query("items", func() (any, error) {
			mu.Lock()
			defer mu.Unlock()
			return append([]string{}, items...), nil
		})
		if err == nil {
			err = step.Update("add_item", func(args worker.Args) (any, error) {
				var item string
				if err := args.Decode(&item); err != nil {
					return nil, err
				}
				mu.Lock()
				defer mu.Unlock()
				items = append(items, item)
				return len(items), nil
			})
		}
		if err != nil {
			return nil, err
		}
		decision, err := worker.WaitForApproval[map[string]any](ctx, step, func(worker.Approval) error {
			*sent++
			return nil
		}, worker.ApprovalTitle("cart"))
		if err != nil {
			return nil, err
		}
		if _, err := worker.WaitForEvent[any](ctx, step, "checkout", 0); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		return map[string]any{"user": user, "items": items, "approved": decision["approved"]}, nil
	}
}

// A run of shared_cart that a Python worker began (CYCLONE_TEST_RUN_ID): its
// approval was created and an update applied there. The Go body replays both.
func TestResumesACartBegunInPython(t *testing.T) {
	runID := os.Getenv("CYCLONE_TEST_RUN_ID")
	if runID == "" {
		t.Skip("CYCLONE_TEST_RUN_ID names no run")
	}
	l := liveServer(t)
	sent := 0
	l.serve(worker.Action{Name: "shared_cart", Handler: sharedCart(&sent)})

	// Applied after the update the Python body applied: the Go replay re-applied it.
	added, err := l.client.Update(l.ctx, runID, "shared_cart", "add_item", []any{"scone"})
	var n int
	if err != nil || added.Decode(&n) != nil || n != 2 {
		t.Fatalf("the update: %+v, %v", added, err)
	}
	pending, err := l.client.ListApprovals(l.ctx, &cyclonev1.ListApprovalsRequest{RunId: runID})
	if err != nil || len(pending) != 1 || pending[0].StepId != "approval" {
		t.Fatalf("pending approvals: %v, %v", pending, err)
	}
	if _, err := l.client.DecideApproval(l.ctx, pending[0].ApprovalId, true, "ok"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.client.SendEvent(l.ctx, runID, "checkout", nil, ""); err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	l.done(runID, &out)
	want := map[string]any{"user": "ann", "items": []any{"tea", "scone"}, "approved": true}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("the output is %v, want %v", out, want)
	}
	if sent != 0 {
		t.Errorf("the Go body sent the approval %d times; the Python body had sent it", sent)
	}
}
