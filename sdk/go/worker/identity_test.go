package worker

import (
	"context"
	"strings"
	"testing"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

func priceOrder(context.Context) (int, error) { return 2290, nil }

type shop struct{}

func (*shop) charge(context.Context) (string, error) { return "ch_1", nil }

func TestAnUnnamedStepRecordsItsFunctionsNameWithoutThePackagePath(t *testing.T) {
	f := &fakeServer{}
	s, ctx := claimed(f)
	for range 2 {
		if _, err := Call(ctx, s, "", priceOrder); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Call(ctx, s, "", (&shop{}).charge); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range f.ends {
		got = append(got, e.StepId+"/"+e.Function)
	}
	if want := "priceOrder/priceOrder priceOrder#2/priceOrder shop.charge/shop.charge"; strings.Join(got, " ") != want {
		t.Fatalf("recorded %v, want %s", got, want)
	}
}

func TestAFunctionLiteralNeedsANameAndDoesNotRun(t *testing.T) {
	f := &fakeServer{}
	var calls int
	done := runBody(t, f, func(ctx context.Context, s *Step) (any, error) {
		return Call(ctx, s, "", run(&calls, 1, nil))
	})
	if fail := done.GetFailure(); fail.GetType() != "InvalidStepName" || !fail.GetNonRetryable() ||
		!strings.Contains(fail.GetMessage(), "function literal") || calls != 0 || len(f.ends) != 0 {
		t.Fatalf("completed with %v after %d calls", done, calls)
	}
}

func TestAJournalRecordedWithAPackageQualifiedFunctionStillReplays(t *testing.T) {
	f := &fakeServer{}
	older := succeeded(1, "price_order", 2290)
	older.Function = "cyclone/examples/go/cmd/order-worker.price_order"
	s, ctx := claimed(f, older)
	var calls int
	if got, err := Call(ctx, s, "price_order", run(&calls, 1, nil)); err != nil || got != 2290 || calls != 0 {
		t.Fatalf("got %d, %v after %d calls", got, err, calls)
	}
}

func TestAMismatchNamesTheRecordedCallAndTheCallMadeNow(t *testing.T) {
	for name, tc := range map[string]struct {
		call    string
		journal []*cyclonev1.StepCall
		wants   []string
	}{
		// Another step at the recorded seq.
		"another step": {"charge", []*cyclonev1.StepCall{succeeded(1, "reserve", "r")},
			[]string{`call #1 recorded step "reserve" of reserve`, `this replay makes step "charge" of charge there`}},
		// The recorded step, made at another seq.
		"another seq": {"price", []*cyclonev1.StepCall{succeeded(2, "price", 1)},
			[]string{`step "price" of price was recorded as call #2`, `step "price" of price as call #1`}},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeServer{}
			var calls int
			done := runBody(t, f, func(ctx context.Context, s *Step) (any, error) {
				return Call(ctx, s, tc.call, run(&calls, 1, nil))
			}, tc.journal...)
			fail := done.GetFailure()
			if fail.GetType() != "ReplayMismatch" || !fail.GetNonRetryable() || calls != 0 {
				t.Fatalf("completed with %v after %d calls", done, calls)
			}
			for _, want := range tc.wants {
				if !strings.Contains(fail.GetMessage(), want) {
					t.Errorf("message %q lacks %q", fail.GetMessage(), want)
				}
			}
		})
	}
}

func TestAStepIdUsedTwiceFailsTheNodeForGood(t *testing.T) {
	f := &fakeServer{}
	var calls int
	done := runBody(t, f, func(ctx context.Context, s *Step) (any, error) {
		_, _ = Call(ctx, s, "tag", run(&calls, 1, nil), WithStepID("eu"))
		return Call(ctx, s, "tag", run(&calls, 2, nil), WithStepID("eu"))
	})
	if fail := done.GetFailure(); fail.GetType() != "DuplicateStepId" || !fail.GetNonRetryable() || calls != 1 {
		t.Fatalf("completed with %v after %d calls", done, calls)
	}
}
