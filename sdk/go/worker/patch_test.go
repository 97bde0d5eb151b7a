package worker

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

func marker(seq int32, id string) *cyclonev1.StepCall {
	return &cyclonev1.StepCall{StepId: "patch:" + id, Seq: seq, Function: "cyclone.patch", Attempt: 1,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, Output: structpb.NewBoolValue(true)}
}

// body makes the calls of a body with a patch: "a", then Patched("p") (or
// DeprecatePatch), then "b"; it returns what Patched said and the seqs sent.
func patchedBody(t *testing.T, deprecate bool, journal ...*cyclonev1.StepCall) (bool, *fakeServer) {
	t.Helper()
	f := &fakeServer{}
	s, ctx := claimed(f, journal...)
	var calls int
	if _, err := Call(ctx, s, "a", run(&calls, 1, nil)); err != nil {
		t.Fatal(err)
	}
	patched := false
	var err error
	if deprecate {
		err = s.DeprecatePatch(ctx, "p")
	} else {
		patched, err = s.Patched(ctx, "p")
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Call(ctx, s, "b", run(&calls, 2, nil)); err != nil {
		t.Fatal(err)
	}
	return patched, f
}

func sent(f *fakeServer) string {
	var out []string
	for _, e := range f.ends {
		out = append(out, fmt.Sprintf("%s@%d", e.StepId, e.Seq))
	}
	return strings.Join(out, " ")
}

func TestAFirstRunRecordsThePatchMarkerAsASafeStepCallsEnd(t *testing.T) {
	patched, f := patchedBody(t, false)
	if !patched || sent(f) != "a@1 patch:p@2 b@3" {
		t.Fatalf("patched %v, sent %s", patched, sent(f))
	}
	m := f.ends[1]
	if m.Function != "cyclone.patch" || m.UnsafeToRepeat || m.GetOutput().GetKind() == nil ||
		!m.GetOutput().GetBoolValue() || m.GetError() != nil || m.LeaseToken != "t-1" {
		t.Fatalf("the marker was sent as %v", m)
	}
}

func TestAReplayConsumesItsMarker(t *testing.T) {
	patched, f := patchedBody(t, false, succeeded(1, "a", 1), marker(2, "p"), succeeded(3, "b", 2))
	if !patched || len(f.ends) != 0 {
		t.Fatalf("patched %v, sent %s", patched, sent(f))
	}
}

func TestARunThatPassedThePointOnOldCodeTakesTheOldPath(t *testing.T) {
	// The next entry is b: the run went on without the patch.
	patched, f := patchedBody(t, false, succeeded(1, "a", 1), succeeded(2, "b", 2))
	if patched || len(f.ends) != 0 {
		t.Fatalf("patched %v, sent %s", patched, sent(f))
	}
	// Nothing at the next seq, but an entry after it: the old code went past it too.
	patched, f = patchedBody(t, false, succeeded(1, "a", 1), succeeded(3, "c", 3))
	if patched || sent(f) != "b@2" {
		t.Fatalf("patched %v, sent %s", patched, sent(f))
	}
}

func TestARunThatStoppedBeforeThePointTakesTheNewPath(t *testing.T) {
	patched, f := patchedBody(t, false, succeeded(1, "a", 1))
	if !patched || sent(f) != "patch:p@2 b@3" {
		t.Fatalf("patched %v, sent %s", patched, sent(f))
	}
}

func TestDeprecatePatchConsumesTheMarkerAndRecordsNothing(t *testing.T) {
	for name, journal := range map[string][]*cyclonev1.StepCall{
		"recorded marker": {succeeded(1, "a", 1), marker(2, "p"), succeeded(3, "b", 2)},
		"old code":        {succeeded(1, "a", 1), succeeded(2, "b", 2)},
	} {
		if _, f := patchedBody(t, true, journal...); len(f.ends) != 0 {
			t.Fatalf("%s: sent %s", name, sent(f))
		}
	}
	if _, f := patchedBody(t, true); sent(f) != "a@1 b@2" {
		t.Fatalf("a first run: sent %s", sent(f))
	}
}

func TestAPatchIdUsedTwiceOrMalformedFailsTheNodeForGood(t *testing.T) {
	for name, tc := range map[string]struct {
		body func(ctx context.Context, s *Step) error
		typ  string
	}{
		"Patched twice": {func(ctx context.Context, s *Step) error {
			_, _ = s.Patched(ctx, "p")
			_, err := s.Patched(ctx, "p")
			return err
		}, "DuplicateStepId"},
		"Patched, then DeprecatePatch": {func(ctx context.Context, s *Step) error {
			_, _ = s.Patched(ctx, "p")
			return s.DeprecatePatch(ctx, "p")
		}, "DuplicateStepId"},
		"empty": {func(ctx context.Context, s *Step) error { _, err := s.Patched(ctx, ""); return err }, "InvalidPatchId"},
		"too long": {func(ctx context.Context, s *Step) error {
			_, err := s.Patched(ctx, strings.Repeat("p", 191))
			return err
		}, "InvalidPatchId"},
		"a newline": {func(ctx context.Context, s *Step) error { return s.DeprecatePatch(ctx, "p\n") }, "InvalidPatchId"},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeServer{}
			done := runBody(t, f, func(ctx context.Context, s *Step) (any, error) {
				if err := tc.body(ctx, s); err == nil {
					t.Error("no error")
				}
				return "went on", nil
			})
			if fail := done.GetFailure(); fail.GetType() != tc.typ || !fail.GetNonRetryable() || !strings.Contains(fail.GetMessage(), "patch") {
				t.Fatalf("completed with %v", done)
			}
		})
	}
	// 190 characters is a patch id.
	f := &fakeServer{}
	s, ctx := claimed(f)
	if ok, err := s.Patched(ctx, strings.Repeat("p", 190)); !ok || err != nil || len(f.ends[0].StepId) != 196 {
		t.Fatalf("a 190-character id: %v, %v", ok, err)
	}
}

func TestOldCodeMeetingAMarkerFailsWithAMismatchNamingIt(t *testing.T) {
	f := &fakeServer{}
	done := runBody(t, f, func(ctx context.Context, s *Step) (any, error) {
		return Call(ctx, s, "b", run(new(int), 2, nil))
	}, marker(1, "p"))
	if fail := done.GetFailure(); fail.GetType() != "ReplayMismatch" || !strings.Contains(fail.GetMessage(), `"patch:p" of cyclone.patch`) {
		t.Fatalf("completed with %v", done)
	}
}

func TestOutsideADurableFunctionThePatchedPathIsTaken(t *testing.T) {
	var s *Step
	if ok, err := s.Patched(context.Background(), "p"); !ok || err != nil || s.DeprecatePatch(context.Background(), "p") != nil {
		t.Fatalf("%v, %v", ok, err)
	}
}
