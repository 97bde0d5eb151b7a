package cyclonetest_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/cyclone-workflows/cyclone/sdk/go/cyclonetest"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

// storyteller emits around a step call that emits too.
func storyteller(ctx context.Context, step *worker.Step) (any, error) {
	if _, err := step.Emit(ctx, "tokens", "once"); err != nil {
		return nil, err
	}
	word, err := worker.Call(ctx, step, "shout", func(c context.Context) (string, error) {
		_, err := step.Emit(c, "tokens", "UPON")
		return "UPON", err
	})
	if err != nil {
		return nil, err
	}
	if _, err := step.Emit(ctx, "tokens", map[string]string{"said": word}); err != nil {
		return nil, err
	}
	return word, nil
}

func TestAReplayAfterACrashStoresNoChunkTwice(t *testing.T) {
	node, err := cyclonetest.NewNode(storyteller)
	if err != nil {
		t.Fatal(err)
	}
	if a := run(t, node, cyclonetest.CrashAtEnd()); a.Status != cyclonetest.Crashed {
		t.Fatalf("attempt 1: %v; want crashed at its end", a)
	}
	if a := run(t, node); a.Status != cyclonetest.Completed {
		t.Fatalf("attempt 2: %v; want completed", a)
	}
	want := map[string][]string{"tokens": {"once", "UPON", `{"said":"UPON"}`}}
	if got := node.Emitted(); !reflect.DeepEqual(got, want) {
		t.Fatalf("emitted %q; want %q", got, want)
	}
}
