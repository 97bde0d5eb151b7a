package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

func TestAnApprovalsExpiryIsRecordedAsPythonWritesIt(t *testing.T) {
	at := time.Date(2026, 12, 13, 10, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		t    time.Time
		want string
	}{
		{at, "2026-12-13T10:04:05+00:00"},
		{at.Add(123456789 * time.Nanosecond), "2026-12-13T10:04:05.123456+00:00"},
		{at.Add(120 * time.Microsecond).In(time.FixedZone("CET", 3600)), "2026-12-13T10:04:05.000120+00:00"},
	} {
		if got := isoformat(c.t); got != c.want {
			t.Errorf("isoformat(%v) = %q, want %q", c.t, got, c.want)
		}
		if back, err := time.Parse(time.RFC3339Nano, c.want); err != nil || !back.Equal(c.t.Truncate(time.Microsecond)) {
			t.Errorf("%q parses as %v, %v", c.want, back, err)
		}
	}
}

func TestAnApprovalWithBadArgumentsFailsTheNodeBeforeAnythingIsSent(t *testing.T) {
	send := func(Approval) error { return nil }
	for name, c := range map[string]struct {
		send func(Approval) error
		opts []ApprovalOption
		want string
	}{
		"no send":         {nil, nil, "no send function"},
		"a short timeout": {send, []ApprovalOption{ApprovalTimeout(time.Millisecond)}, "1s to 366 days"},
		"a long title":    {send, []ApprovalOption{ApprovalTitle(strings.Repeat("é", 1001))}, "at most 1000"},
		"a long step id":  {send, []ApprovalOption{ApprovalStepID(strings.Repeat("a", 196))}, "at most 195"},
	} {
		// No client: a call that reached the server would panic.
		step := &Step{ClaimedStep: &cyclonev1.ClaimedStep{RunId: "r", Node: "n"}}
		_, err := WaitForApproval[any](context.Background(), step, c.send, c.opts...)
		var f *Failure
		if !errors.As(err, &f) || !f.NonRetryable || f.Type != "InvalidArgument" || !strings.Contains(f.Message, c.want) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := WaitForApproval[any](context.Background(), nil, send); err == nil {
		t.Error("outside a durable function: no error")
	}
}
