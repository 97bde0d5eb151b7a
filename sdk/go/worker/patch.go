package worker

import (
	"context"

	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// Patch markers let a durable function change the step calls it makes while runs are
// in flight: the new code goes behind `if patched, _ := step.Patched(ctx, "id"); patched`,
// and a run that passed that point on the old code keeps taking the old path when it
// replays on the new code.
//
// A marker is an entry of the journal like a safe step call's end: step id
// "patch:<id>", function "cyclone.patch", output true. Patched reads the journal at
// the body's next seq: the marker there means the run took the new path (it uses
// that seq); another entry there, or after it, means the run passed this point on
// the old code (no seq used); nothing there or after it means the run gets here for
// the first time, on this code: the marker is recorded and the new path taken.

const (
	patchFunction = "cyclone.patch"
	patchPrefix   = "patch:"
	maxPatchID    = maxName - len(patchPrefix) - 4 // 190 characters
)

// Patched says whether the durable function takes the new path of the patch id: true
// for a run that gets here first on the code that has the patch (the marker is
// recorded then) or that recorded the marker before, false for a run that passed this
// point on the code before the patch. Outside a durable function (s nil), it is true.
//
// Each patch id is used at most once per body; ids are 1-190 printable characters.
// An error stops the body as a failing step call does (lost lease, bad id, id used
// twice): return it.
func (s *Step) Patched(ctx context.Context, id string) (bool, error) {
	if s == nil {
		return true, nil
	}
	j, seq, at, err := s.openPatch(id)
	if err != nil {
		return false, err
	}
	stepID := patchPrefix + id
	if at != nil || j.after(seq) {
		return at != nil, nil // the marker (its seq taken), or the old path (none)
	}
	j.mu.Lock()
	recordedElsewhere := j.byID[stepID]
	err = j.next(stepID, s.limits)
	j.mu.Unlock()
	switch {
	case recordedElsewhere != nil:
		return false, s.stop(fatal("ReplayMismatch", "the durable function does not replay its journal: patch "+
			"marker %q was recorded as call #%d, and this replay reaches it as call #%d", id, recordedElsewhere.Seq, seq))
	case err != nil:
		return false, s.stop(err)
	}
	c := &stepCall{step: s, id: stepID, seq: seq, function: patchFunction}
	if _, err := c.end(ctx, structpb.NewBoolValue(true), nil); err != nil {
		return false, err
	}
	return true, nil
}

// DeprecatePatch is the step after a patch has been in place long enough that no run
// in flight takes its old path any more: the old path is deleted, and the body calls
// DeprecatePatch where it called Patched. A run that recorded the marker replays it
// (its seq is used); any other records nothing. Outside a durable function (s nil),
// it does nothing.
func (s *Step) DeprecatePatch(ctx context.Context, id string) error {
	if s == nil {
		return nil
	}
	_, _, _, err := s.openPatch(id)
	return err
}

// openPatch checks the patch id and marks it used in this attempt, and finds its
// marker at the next seq of the body: when it is there, that seq is taken and at is
// the marker; else at is nil and seq is the seq a new marker would take.
func (s *Step) openPatch(id string) (j *journal, seq int32, at *cyclonev1.StepCall, err error) {
	stepID := patchPrefix + id
	if err := checkName("patch id", id, maxPatchID); err != nil {
		return nil, 0, nil, s.stop(fatal("InvalidPatchId", "%v", err))
	}
	j = s.journal()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.stopped != nil {
		return nil, 0, nil, j.stopped
	}
	if j.used[stepID] {
		return nil, 0, nil, s.stopLocked(fatal("DuplicateStepId", "patch %q is used twice in this durable "+
			"function; each patch id marks one place in the body", id))
	}
	j.used[stepID] = true
	seq = j.seq + 1
	at = j.bySeq[seq]
	if at == nil || at.StepId != stepID {
		return j, seq, nil, nil
	}
	if at.Function != patchFunction {
		return nil, 0, nil, s.stopLocked(fatal("ReplayMismatch", "the durable function does not replay its "+
			"journal: call #%d recorded step %q of %s; this replay makes patch marker %q (%s) there",
			seq, at.StepId, at.Function, id, patchFunction))
	}
	j.seq = seq
	return j, seq, at, nil
}

// after says whether the journal holds an entry at seq or after it.
func (j *journal) after(seq int32) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	for s := range j.bySeq {
		if s >= seq {
			return true
		}
	}
	return false
}

func (s *Step) stopLocked(err error) error {
	j := s.steps
	if j.stopped == nil {
		j.stopped = err
	}
	if s.cancel != nil {
		s.cancel(j.stopped)
	}
	return j.stopped
}
