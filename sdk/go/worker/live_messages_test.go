package worker_test

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cyclone-workflows/cyclone/sdk/go/client"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

// cartBody keeps a cart that updates fill: it waits for "checkout", bills in a step
// call that says so on billing and waits for release, then waits for "done".
func cartBody(billing chan<- struct{}, release <-chan struct{}) worker.Handler {
	return func(ctx context.Context, step *worker.Step) (any, error) {
		var mu sync.Mutex
		items := []string{}
		err := step.Query("items", func() (any, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(items), nil
		})
		if err == nil {
			err = step.QueryWithArgs("has", func(args worker.Args) (any, error) {
				var item string
				if err := args.Decode(&item); err != nil {
					return nil, err
				}
				mu.Lock()
				defer mu.Unlock()
				return slices.Contains(items, item), nil
			})
		}
		if err == nil {
			err = step.Update("add_item", func(args worker.Args) (any, error) {
				var item string
				if err := args.Decode(&item); err != nil {
					return nil, err
				}
				if item == "" {
					return nil, &worker.Failure{Type: "EmptyItem", Message: "an item has a name"}
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
		if _, err := worker.WaitForEvent[any](ctx, step, "checkout", 0); err != nil {
			return nil, err
		}
		if _, err := worker.Call(ctx, step, "bill", func(ctx context.Context) (bool, error) {
			select {
			case billing <- struct{}{}:
			default:
			}
			select {
			case <-release:
				return true, nil
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}); err != nil {
			return nil, err
		}
		if _, err := worker.WaitForEvent[any](ctx, step, "done", 0); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		return items, nil
	}
}

func TestLiveUpdatesChangeAWaitingBodyAndQueriesReadIt(t *testing.T) {
	l := liveServer(t)
	billing, release := make(chan struct{}, 1), make(chan struct{})
	var released sync.Once
	// A test that fails before it releases the bill must not leave it running.
	t.Cleanup(func() { released.Do(func() { close(release) }) })
	l.serve(worker.Action{Name: "live.messages.cart", Handler: cartBody(billing, release)})
	runID := l.submit("live.messages.cart", nil)
	add := func(item, id string) (*client.UpdateResult, error) {
		var opts []client.UpdateOption
		if id != "" {
			opts = append(opts, client.WithUpdateID(id))
		}
		return l.client.Update(l.ctx, runID, "body", "add_item", []any{item}, opts...)
	}
	count := func(r *client.UpdateResult) (n int) {
		if err := r.Decode(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The body waits for "checkout": each update wakes it and is applied at its wait.
	l.suspended(runID)
	first, err := add("tea", "u-tea")
	if err != nil || count(first) != 1 || !first.Created || first.UpdateID != "u-tea" {
		t.Fatalf("the first update: %+v, %v", first, err)
	}
	again, err := add("tea", "u-tea")
	if err != nil || count(again) != 1 || again.Created || again.Seq != first.Seq {
		t.Fatalf("the first update again: %+v, %v", again, err)
	}
	second, err := add("scone", "")
	if err != nil || count(second) != 2 || second.UpdateID == "" || second.Seq <= first.Seq {
		t.Fatalf("the second update: %+v, %v", second, err)
	}
	if _, err := add("", "u-empty"); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "EmptyItem") {
		t.Errorf("an update its handler refuses: %v", err)
	}
	if _, err := l.client.Update(l.ctx, runID, "body", "remove_item", []any{"tea"}); status.Code(err) != codes.NotFound {
		t.Errorf("an update the body has no handler for: %v", err)
	}

	// Waiting, the body runs nowhere: the published value answers.
	l.suspended(runID)
	answer, err := l.client.Query(l.ctx, runID, "body", "items", nil)
	var items []string
	if err != nil || answer.Decode(&items) != nil || !answer.Published || !reflect.DeepEqual(items, []string{"tea", "scone"}) {
		t.Fatalf("the items of the waiting body: %+v (%s), %v", answer, answer.Result, err)
	}
	if _, err := l.client.Query(l.ctx, runID, "body", "has", []any{"tea"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a query with arguments of a waiting body: %v", err)
	}

	// Billing, the body runs on the worker, which answers at once.
	if _, err := l.client.SendEvent(l.ctx, runID, "checkout", nil, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-billing: // the replay is past the wait, where it applied the updates again
	case <-l.ctx.Done():
		t.Fatal("the body never billed")
	}
	var has bool
	answer, err = l.client.Query(l.ctx, runID, "body", "has", []any{"scone"})
	if err != nil || answer.Published || answer.Decode(&has) != nil || !has {
		t.Fatalf("a query of the running body: %+v, %v", answer, err)
	}
	if _, err := l.client.Query(l.ctx, runID, "body", "total", nil); status.Code(err) != codes.NotFound ||
		!strings.Contains(err.Error(), "items") {
		t.Errorf("a query the running body has no handler for: %v", err)
	}
	// An update sent while the step call runs is applied once it returned (or at the
	// next wait, if it comes later).
	third := make(chan *client.UpdateResult, 1)
	go func() {
		r, err := add("coffee", "u-coffee")
		if err != nil {
			t.Errorf("the third update: %v", err)
		}
		third <- r
	}()
	released.Do(func() { close(release) })
	if r := <-third; r == nil || count(r) != 3 {
		t.Fatalf("the third update: %+v", r)
	}
	if _, err := l.client.SendEvent(l.ctx, runID, "done", nil, ""); err != nil {
		t.Fatal(err)
	}

	// Every replay applied the recorded updates again: the body ends with all three.
	l.done(runID, &items)
	if want := []string{"tea", "scone", "coffee"}; !reflect.DeepEqual(items, want) {
		t.Errorf("the body's output is %v, want %v", items, want)
	}
	answer, err = l.client.Query(l.ctx, runID, "body", "items", nil)
	if err != nil || !answer.Published || answer.Decode(&items) != nil || len(items) != 3 {
		t.Errorf("the items of the finished body: %+v, %v", answer, err)
	}

	run, err := l.client.GetRun(l.ctx, runID, false)
	if err != nil {
		t.Fatal(err)
	}
	updates := map[string]map[string]any{}
	for _, c := range run.Steps[0].Journal {
		if c.Function == "cyclone.update" {
			var out map[string]any
			if err := client.Decode(c.Output, &out); err != nil {
				t.Fatal(err)
			}
			updates[c.StepId] = out
		}
	}
	tea := updates["update:u-tea"]
	if len(updates) != 5 || tea["update"] != "add_item" || !reflect.DeepEqual(tea["args"], []any{"tea"}) || tea["result"] != float64(1) {
		t.Errorf("the journal's updates: %v", updates)
	}
	if refused := updates["update:u-empty"]["error"]; !reflect.DeepEqual(refused, map[string]any{"type": "EmptyItem", "message": "an item has a name"}) {
		t.Errorf("the refused update is recorded as %v", refused)
	}
}
