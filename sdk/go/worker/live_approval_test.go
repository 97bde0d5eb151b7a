package worker_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

type decision struct {
	Approved bool   `json:"approved"`
	Comment  string `json:"comment"`
}

func TestLiveABodyWaitsForTwoApprovalsAndSendsEachOnce(t *testing.T) {
	l := liveServer(t)
	sent := make(chan worker.Approval, 10)
	refund := func(ctx context.Context, step *worker.Step) (any, error) {
		send := func(a worker.Approval) error { sent <- a; return nil }
		first, err := worker.WaitForApproval[decision](ctx, step, send,
			worker.ApprovalTitle("refund 7"), worker.ApprovalTimeout(time.Hour))
		if err != nil {
			return nil, err
		}
		second, err := worker.WaitForApproval[decision](ctx, step, send, worker.ApprovalTitle("and pay back"))
		if err != nil {
			return nil, err
		}
		return []decision{first, second}, nil
	}
	l.serve(worker.Action{Name: "live.approval.refund", Handler: refund})
	runID := l.submit("live.approval.refund", nil)

	// Each approval, once sent, is listed pending and decided by the client.
	for i, d := range []decision{{true, "fine"}, {false, "no"}} {
		var approval worker.Approval
		select {
		case approval = <-sent:
		case <-l.ctx.Done():
			t.Fatalf("approval %d was never sent", i+1)
		}
		if approval.URL == "" || approval.Token == "" || approval.ExpiresAt.IsZero() {
			t.Errorf("approval %d: %+v", i+1, approval)
		}
		pending, err := l.client.ListApprovals(l.ctx, &cyclonev1.ListApprovalsRequest{RunId: runID})
		if err != nil || len(pending) != 1 || pending[0].ApprovalId != approval.ApprovalID {
			t.Fatalf("pending approvals of %s: %v, %v", runID, pending, err)
		}
		want := map[int]string{0: "approval", 1: "approval#2"}[i]
		if pending[0].StepId != want || pending[0].Title != []string{"refund 7", "and pay back"}[i] {
			t.Errorf("approval %d is listed as %v", i+1, pending[0])
		}
		decided, err := l.client.DecideApproval(l.ctx, approval.ApprovalID, d.Approved, d.Comment)
		if err != nil || decided.DecidedAt == nil {
			t.Fatalf("DecideApproval: %v, %v", decided, err)
		}
		if _, err := l.client.DecideApproval(l.ctx, approval.ApprovalID, true, "again"); err == nil {
			t.Error("an approval was decided twice")
		}
	}
	var got []decision
	l.done(runID, &got)
	if want := []decision{{true, "fine"}, {false, "no"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("the body got %+v, want %+v", got, want)
	}
	// The body replayed after each decision; neither approval was sent again.
	if len(sent) != 0 {
		t.Errorf("%d more approvals were sent", len(sent))
	}

	run, err := l.client.GetRun(l.ctx, runID, false)
	if err != nil {
		t.Fatal(err)
	}
	var journal [][2]string
	for _, c := range run.Steps[0].Journal {
		journal = append(journal, [2]string{c.StepId, c.Function})
	}
	want := [][2]string{
		{"approval", "cyclone.approval"}, {"approval.wait", "cyclone.event"},
		{"approval#2", "cyclone.approval"}, {"approval#2.wait", "cyclone.event"},
	}
	if !reflect.DeepEqual(journal, want) {
		t.Errorf("the journal is %v, want %v", journal, want)
	}
	var asked map[string]any
	if err := decodeValue(run.Steps[0].Journal[0].Output, &asked); err != nil || len(asked) != 3 ||
		asked["event"] == nil || asked["expires_at"] == nil || asked["approval_id"] == nil {
		t.Errorf("the approval call recorded %v (%v)", asked, err)
	}
}
