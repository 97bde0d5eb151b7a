package worker

import (
	"context"
	"errors"
	"math"
	"testing"
)

func TestTheDigestIsTheOneOfTheDocumentedRule(t *testing.T) {
	// docs/other-languages.md: charge("o-1", 42) digests [["o-1",42],{}], whose
	// SHA-256 `printf '%s' '[["o-1",42],{}]' | sha256sum` gives.
	var o callOptions
	WithArgs("o-1", 42)(&o)
	const want = "80c02077c1ec692fd7dc806b04719d2752139256d51c31e48f68c610cae457cd"
	if o.digestErr != nil || o.digest != want {
		t.Fatalf("WithArgs(\"o-1\", 42) digest = %q (%v), want %s", o.digest, o.digestErr, want)
	}
}

func TestCanonicalJSONSortsKeysAndEscapesOnlyWhatJSONRequires(t *testing.T) {
	type order struct {
		Zone  string `json:"zone"`
		Items []int  `json:"items"`
		Note  string `json:"note,omitempty"`
	}
	text, err := canonicalJSON([]any{
		[]any{"a\"b\\c\n\t\x01<&>é\u2028", order{Zone: "eu", Items: []int{3, 1}}, 2.5, 1e100, nil, true},
		map[string]any{"b": 1, "a": map[string]any{"é": 1, "z": 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// As Python's json.dumps(..., sort_keys=True, separators=(",", ":"),
	// ensure_ascii=False) writes it.
	want := `[["a\"b\\c\n\t\u0001<&>é` + "\u2028" + `",{"items":[3,1],"zone":"eu"},2.5,1e+100,null,true],{"a":{"z":2,"é":1},"b":1}]`
	if string(text) != want {
		t.Fatalf("canonical JSON\n got %s\nwant %s", text, want)
	}
}

func TestArgumentsThatAreNotJSONFailTheNodeForGood(t *testing.T) {
	f := &fakeServer{}
	s, ctx := claimed(f)
	var calls int
	_, err := Call(ctx, s, "charge", run(&calls, "ch", nil), WithArgs(math.Inf(1)))
	var failure *Failure
	if !errors.As(err, &failure) || failure.Type != "ArgumentsNotJson" || !failure.NonRetryable || calls != 0 {
		t.Fatalf("error = %v after %d calls; want a non-retryable ArgumentsNotJson before the call", err, calls)
	}
}

func TestTheDigestIsSentWithTheCallAndCheckedOnReplay(t *testing.T) {
	f := &fakeServer{}
	s, ctx := claimed(f)
	var calls int
	if _, err := Call(ctx, s, "charge", run(&calls, "ch", nil), WithArgs("o-1", 42), UnsafeToRepeat()); err != nil {
		t.Fatal(err)
	}
	digest, _ := argsDigest([]any{[]any{"o-1", 42}, map[string]any{}})
	if len(f.begins) != 1 || f.begins[0].ArgsDigest != digest || len(f.ends) != 1 || f.ends[0].ArgsDigest != digest {
		t.Fatalf("begins %v, ends %v; want the digest %s in both", f.begins, f.ends, digest)
	}

	recorded := succeeded(1, "charge", "ch")
	recorded.ArgsDigest = digest
	// The same arguments replay; a call without a digest is not checked.
	for _, opts := range [][]CallOption{{WithArgs("o-1", 42)}, nil} {
		s, ctx = claimed(&fakeServer{}, recorded)
		if got, err := Call(ctx, s, "charge", run(&calls, "other", nil), opts...); err != nil || got != "ch" {
			t.Fatalf("replay = %q, %v; want the recorded ch", got, err)
		}
	}
	// Other arguments: the node fails for good, naming the step and its function.
	s, ctx = claimed(&fakeServer{}, recorded)
	_, err := Call(ctx, s, "charge", run(&calls, "other", nil), WithArgs("o-1", 43))
	var failure *Failure
	if !errors.As(err, &failure) || failure.Type != "ReplayMismatch" || !failure.NonRetryable || calls != 1 {
		t.Fatalf("error = %v after %d calls; want a non-retryable ReplayMismatch", err, calls)
	}
	if !errors.Is(context.Cause(ctx), failure) {
		t.Fatalf("the body's context was not stopped with the mismatch: %v", context.Cause(ctx))
	}
	// A recorded entry without a digest is not checked.
	s, ctx = claimed(&fakeServer{}, succeeded(1, "charge", "ch"))
	if _, err := Call(ctx, s, "charge", run(&calls, "other", nil), WithArgs("o-1", 43)); err != nil {
		t.Fatalf("an entry without a digest was checked: %v", err)
	}
}
