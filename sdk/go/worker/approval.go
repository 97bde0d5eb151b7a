package worker

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// An approval is a person's decision that a durable function waits for
// (docs/time-and-events.md, "Approvals"): the server makes a one-time URL, the body
// hands it out (a mail, a chat message), and the decision POSTed to it (or given with
// client.DecideApproval) is what the body gets. Its journal shape is the Python SDK's,
// so either SDK replays a body the other began: an approval call "approval",
// "approval#2"... (function "cyclone.approval", recording {"approval_id", "event",
// "expires_at"}, never the token), then a wait for its event "<step id>.wait"
// (function "cyclone.event").

const (
	approvalFunction = "cyclone.approval"
	approvalWait     = ".wait"
	maxApprovalTitle = 1000
	maxApprovalTTL   = 366 * 24 * time.Hour
)

// Approval is an approval a body asked for, as its send function gets it: the URL to
// POST a JSON decision to (once), the bare token in it, the approval's id and when
// the token expires.
type Approval struct {
	ApprovalID string
	URL        string
	Token      string
	ExpiresAt  time.Time
}

// ApprovalOption changes an approval.
type ApprovalOption func(*approvalOptions)

type approvalOptions struct {
	title   string
	timeout time.Duration
	stepID  string
}

// ApprovalTitle is what is asked, shown by the console (at most 1000 characters).
func ApprovalTitle(title string) ApprovalOption { return func(o *approvalOptions) { o.title = title } }

// ApprovalTimeout is how long the token is valid: 1s to 366 days; without it, the
// server's --approval-timeout (7 days by default).
func ApprovalTimeout(d time.Duration) ApprovalOption {
	return func(o *approvalOptions) { o.timeout = d }
}

// ApprovalStepID names the approval call instead of "approval", "approval#2"...; its
// wait is the id with ".wait". At most 195 characters.
func ApprovalStepID(id string) ApprovalOption { return func(o *approvalOptions) { o.stepID = id } }

// approvalCall is what an approval call records.
type approvalCall struct {
	ApprovalID string `json:"approval_id"`
	Event      string `json:"event"`
	ExpiresAt  string `json:"expires_at"`
}

// WaitForApproval asks a person for a decision through a one-time URL and waits for
// it without holding a worker's slot, as WaitForEvent does; it returns the JSON the
// decision carried, decoded into T ({"approved": true, "comment": ..., "decided_by":
// ...} from client.DecideApproval or the console, or whatever was POSTed to the URL).
//
//	decision, err := worker.WaitForApproval[Decision](ctx, step, func(a worker.Approval) error {
//		return mailer.Send(ctx, manager, a.URL)
//	}, worker.ApprovalTitle("refund 120 EUR"), worker.ApprovalTimeout(48*time.Hour))
//
// send runs once, as a step call does, when the approval is created (again only if
// its attempt is lost before its outcome is recorded: the approval then gets a new
// token and the old one stops working); its error is the call's recorded failure. A
// replay neither creates the approval nor calls send again. When the token expires
// with no decision, the wait fails with a *Failure of type EventTimeout, recorded.
func WaitForApproval[T any](ctx context.Context, s *Step, send func(Approval) error, opts ...ApprovalOption) (T, error) {
	var zero T
	if s == nil {
		return zero, errOutside("WaitForApproval")
	}
	var o approvalOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.check(send); err != nil {
		return zero, s.stop(fatal("InvalidArgument", "WaitForApproval: %v", err))
	}
	// An approval call named by the body is not counted among "approval", "approval#2"...
	base := "approval"
	if o.stepID != "" {
		base = o.stepID
	}
	c, err := s.open(approvalFunction, base, callOptions{stepID: o.stepID})
	if err != nil {
		return zero, err
	}
	switch c.recorded.GetStatus() {
	case cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, cyclonev1.StepCallStatus_STEP_CALL_STATUS_FAILED:
	default:
		if c, err = s.createApproval(ctx, c, o, send); err != nil {
			return zero, err
		}
	}
	if c, err = c.atPoint(ctx, nil); err != nil {
		return zero, err
	}
	asked, err := replayed[approvalCall](c, nil)
	if err != nil {
		return zero, err
	}
	expires, err := time.Parse(time.RFC3339Nano, asked.ExpiresAt)
	if err != nil || asked.Event == "" {
		return zero, s.stop(fatal("ReplayMismatch", "step call %s is recorded as %s, not as an approval", c.id, c.recorded.GetOutput()))
	}
	timeout := min(max(time.Until(expires), time.Millisecond), maxApprovalTTL)
	waitID := c.id + approvalWait
	w, err := s.wait(ctx, eventFunction, waitID, []CallOption{WithStepID(waitID)}, func(r *cyclonev1.WaitRequest) {
		r.Until = &cyclonev1.WaitRequest_Event{Event: &cyclonev1.EventWait{Name: asked.Event, Timeout: durationpb.New(timeout)}}
	})
	return replayed[T](w, err)
}

func (o *approvalOptions) check(send func(Approval) error) error {
	switch {
	case send == nil:
		return fmt.Errorf("no send function")
	case o.timeout != 0 && (o.timeout < time.Second || o.timeout > maxApprovalTTL):
		return fmt.Errorf("an approval's timeout must be 1s to 366 days, got %v", o.timeout)
	case utf8.RuneCountInString(o.title) > maxApprovalTitle:
		return fmt.Errorf("an approval's title must be at most %d characters", maxApprovalTitle)
	case utf8.RuneCountInString(o.stepID) > maxEventName-len(approvalWait):
		return fmt.Errorf("an approval's step id must be at most %d characters", maxEventName-len(approvalWait))
	}
	return nil
}

// createApproval makes the approval call c: CreateApproval, then send with the
// approval unless it is decided already, then its outcome recorded.
func (s *Step) createApproval(ctx context.Context, c *stepCall, o approvalOptions, send func(Approval) error) (*stepCall, error) {
	req := &cyclonev1.CreateApprovalRequest{RunId: s.RunId, Node: s.Node, LeaseToken: s.LeaseToken, StepId: c.id, Title: o.title}
	if o.timeout != 0 {
		req.Timeout = durationpb.New(o.timeout)
	}
	resp, err := retryUnavailable(ctx, func(ctx context.Context) (*cyclonev1.CreateApprovalResponse, error) {
		return s.client.CreateApproval(ctx, req)
	})
	if err != nil {
		return nil, s.refused("CreateApproval", c, err)
	}
	expires := resp.ExpiresAt.AsTime()
	var sendErr error
	if !resp.Decided {
		sendErr = send(Approval{ApprovalID: resp.ApprovalId, URL: resp.Url, Token: resp.Token, ExpiresAt: expires})
		if sendErr != nil && ctx.Err() != nil {
			return nil, sendErr // the node is stopping: record nothing, as Call does
		}
	}
	value, err := toValue(approvalCall{ApprovalID: resp.ApprovalId, Event: resp.Event, ExpiresAt: isoformat(expires)})
	if err != nil {
		return nil, err
	}
	if sendErr != nil {
		value = nil
	}
	return c.end(ctx, value, sendErr)
}

// isoformat writes t as Python's datetime.isoformat does for a UTC time, as the
// Python SDK records an approval's expiry: microseconds unless there are none, and
// "+00:00".
func isoformat(t time.Time) string {
	t = t.UTC().Truncate(time.Microsecond)
	if t.Nanosecond() == 0 {
		return t.Format("2006-01-02T15:04:05-07:00")
	}
	return t.Format("2006-01-02T15:04:05.000000-07:00")
}
