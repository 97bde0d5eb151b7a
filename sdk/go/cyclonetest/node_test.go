package cyclonetest_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cyclone-workflows/cyclone/sdk/go/cyclonetest"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// checkout is a durable function: a safe price, an unsafe charge, a safe receipt;
// a declined charge is handled.
func checkout(ctx context.Context, step *worker.Step) (any, error) {
	var o order
	if err := step.DecodeRunInput(&o); err != nil {
		return nil, worker.NonRetryable("BadInput", err)
	}
	total, err := worker.Call(ctx, step, "price", func(context.Context) (int, error) { return o.Amount + 500, nil })
	if err != nil {
		return nil, err
	}
	charge, err := worker.Call(ctx, step, "charge", func(context.Context) (string, error) {
		return "ch_" + o.ID, nil
	}, worker.UnsafeToRepeat())
	var declined *worker.Failure
	if errors.As(err, &declined) && !declined.NonRetryable {
		return map[string]any{"status": "cancelled", "reason": declined.Message}, nil
	}
	if err != nil {
		return nil, err
	}
	if _, err := worker.Call(ctx, step, "receipt", func(context.Context) (bool, error) { return true, nil }); err != nil {
		return nil, err
	}
	return map[string]any{"status": "paid", "total": total, "charge": charge}, nil
}

func newCheckout(t *testing.T) *cyclonetest.Node {
	t.Helper()
	node, err := cyclonetest.NewNode(checkout, cyclonetest.RunInput(order{ID: "o-1", Amount: 1800}))
	if err != nil {
		t.Fatal(err)
	}
	return node
}

func run(t *testing.T, node *cyclonetest.Node, crash ...cyclonetest.Crash) cyclonetest.Attempt {
	t.Helper()
	a, err := node.Run(context.Background(), crash...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func paid(t *testing.T, a cyclonetest.Attempt) {
	t.Helper()
	var out struct {
		Status string `json:"status"`
		Total  int    `json:"total"`
	}
	if err := a.Decode(&out); err != nil || out.Status != "paid" || out.Total != 2300 {
		t.Fatalf("attempt %d: %+v, %v (%v)", a.Number, out, err, a.Failure)
	}
}

func TestASafeCallCrashedBeforeItsRecordRunsAgain(t *testing.T) {
	node := newCheckout(t)
	if a := run(t, node, cyclonetest.CrashBeforeRecord("price")); a.Status != cyclonetest.Crashed {
		t.Fatalf("first attempt %s", a.Status)
	}
	a := run(t, node)
	paid(t, a)
	if node.Executions("price") != 2 || node.Executions("charge") != 1 || strings.Join(a.Ran, ",") != "price,charge,receipt" {
		t.Fatalf("executions %d %d, ran %v", node.Executions("price"), node.Executions("charge"), a.Ran)
	}
}

func TestARecordedCallIsReplayedNotRunAgain(t *testing.T) {
	node := newCheckout(t)
	run(t, node, cyclonetest.CrashAfterRecord("charge"))
	a := run(t, node)
	paid(t, a)
	if node.Executions("price") != 1 || node.Executions("charge") != 1 || strings.Join(a.Ran, ",") != "receipt" {
		t.Fatalf("ran %v", a.Ran)
	}
	if a := run(t, newCheckout(t), cyclonetest.CrashAtEnd()); a.Status != cyclonetest.Crashed {
		t.Fatalf("crash at the end: %s", a.Status)
	}
}

func TestAnUnsafeCallInterruptedBlocksUntilResolved(t *testing.T) {
	for name, resolve := range map[string]func(*cyclonetest.Node) error{
		"result": func(n *cyclonetest.Node) error { return n.ResolveResult("charge", "ch_o-1") },
		"error":  func(n *cyclonetest.Node) error { return n.ResolveError("charge", "card declined") },
	} {
		t.Run(name, func(t *testing.T) {
			node := newCheckout(t)
			run(t, node, cyclonetest.CrashBeforeRecord("charge"))
			a := run(t, node)
			if a.Status != cyclonetest.Blocked || a.BlockedOn != "charge" || node.Executions("charge") != 1 {
				t.Fatalf("second attempt %s on %q, %d charges", a.Status, a.BlockedOn, node.Executions("charge"))
			}
			if again := run(t, node); again.Status != cyclonetest.Blocked {
				t.Fatalf("a blocked node ran: %s", again.Status)
			}
			if err := resolve(node); err != nil {
				t.Fatal(err)
			}
			a = run(t, node)
			if a.Status != cyclonetest.Completed || node.Executions("charge") != 1 {
				t.Fatalf("after resolving: %s, %d charges", a.Status, node.Executions("charge"))
			}
			var out map[string]any
			_ = a.Decode(&out)
			if want := map[string]string{"result": "paid", "error": "cancelled"}[name]; out["status"] != want {
				t.Fatalf("output %v; want status %s", out, want)
			}
		})
	}
}

func TestAnUnsafeCallCrashedBeforeItRanIsDiscardedAndRuns(t *testing.T) {
	node := newCheckout(t)
	run(t, node, cyclonetest.CrashBeforeCall("charge"))
	if a := run(t, node); a.Status != cyclonetest.Blocked || node.Executions("charge") != 0 {
		t.Fatalf("%s, %d charges", a.Status, node.Executions("charge"))
	}
	if err := node.ResolveDiscard("charge"); err != nil {
		t.Fatal(err)
	}
	paid(t, run(t, node))
	if node.Executions("charge") != 1 || len(node.Journal()) != 3 {
		t.Fatalf("%d charges, journal %v", node.Executions("charge"), node.Journal())
	}
}

func TestACrashPointNeverReachedIsAnError(t *testing.T) {
	node := newCheckout(t)
	a, err := node.Run(context.Background(), cyclonetest.CrashBeforeRecord("refund"))
	if err == nil || !strings.Contains(err.Error(), `"refund"`) || a.Status != cyclonetest.Completed {
		t.Fatalf("%v, %s", err, a.Status)
	}
	if err := node.ResolveDiscard("charge"); err == nil {
		t.Fatal("resolved a node that is not blocked")
	}
}

func TestRunToEndRetriesAsTheServerWould(t *testing.T) {
	calls := 0
	flaky := func(ctx context.Context, step *worker.Step) (any, error) {
		return worker.Call(ctx, step, "fetch", func(context.Context) (int, error) {
			calls++
			if calls < 3 {
				return 0, errors.New("timeout")
			}
			return calls, nil
		})
	}
	node, _ := cyclonetest.NewNode(flaky, cyclonetest.MaxAttempts(5))
	// A recorded failure is replayed: the body returns it at every attempt.
	a, err := node.RunToEnd(context.Background())
	if err != nil || a.Status != cyclonetest.Failed || a.Number != 5 || calls != 1 {
		t.Fatalf("%v: attempt %d %s, %d calls", err, a.Number, a.Status, calls)
	}
	if _, err := cyclonetest.NewNode(flaky, cyclonetest.Input(make(chan int))); err == nil {
		t.Fatal("an input that is not JSON was taken")
	}
}
