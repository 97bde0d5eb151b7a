package client

import (
	"context"
	"fmt"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// ListApprovals returns the approvals durable functions asked for
// (worker.WaitForApproval), newest first: the pending ones, or with req.All every
// one; with req.RunId, those of one run. A nil req lists every pending one.
func (c *Client) ListApprovals(ctx context.Context, req *cyclonev1.ListApprovalsRequest) ([]*cyclonev1.Approval, error) {
	if req == nil {
		req = &cyclonev1.ListApprovalsRequest{}
	}
	resp, err := c.admin.ListApprovals(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("ListApprovals: %w", err)
	}
	return resp.Approvals, nil
}

// DecideApproval decides a pending approval as its URL would, once: the body waiting
// for it gets {"approved": approved, "comment": comment, "decided_by": the caller}.
// NotFound for an unknown approval; FailedPrecondition when it is decided already,
// expired, or its run is finished.
func (c *Client) DecideApproval(ctx context.Context, approvalID string, approved bool, comment string) (*cyclonev1.Approval, error) {
	resp, err := c.admin.DecideApproval(ctx, &cyclonev1.DecideApprovalRequest{
		ApprovalId: approvalID, Approved: approved, Comment: comment,
	})
	if err != nil {
		return nil, fmt.Errorf("DecideApproval %s: %w", approvalID, err)
	}
	return resp.Approval, nil
}
