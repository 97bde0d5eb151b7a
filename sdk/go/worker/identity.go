package worker

import (
	"fmt"
	"reflect"
	"regexp"
	"runtime"
	"strings"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// A step call is known to the journal by its seq, its step id and its function: the
// name given to Call, or the Go function's own name without its package path. How
// the code is built (the package's path, a package moved in a refactoring) must not
// change what a replay matches.

// stepName is the function a call records: name when given, else fn's name.
func stepName(name string, fn any) (string, error) {
	if name == "" {
		var err error
		if name, err = funcName(fn); err != nil {
			return "", err
		}
	}
	if err := checkName("step name", name, maxName-occurrenceRoom); err != nil {
		return "", err
	}
	return name, nil
}

// A function literal (or a goroutine wrapper): its name is a counter in the function
// around it, which changes when another literal is added before it.
var anonymous = regexp.MustCompile(`(^|\.)(func|gowrap|deferwrap)\d+(\.|$)`)

// funcName is the name of the named function fn without its package path:
// "priceOrder" for pkg/path.priceOrder, "orders.charge" for a method value
// pkg/path.(*orders).charge-fm.
func funcName(fn any) (string, error) {
	v := reflect.ValueOf(fn)
	if v.Kind() != reflect.Func || v.IsNil() {
		return "", fmt.Errorf("a step needs a name or a function, got %T", fn)
	}
	f := runtime.FuncForPC(v.Pointer())
	if f == nil {
		return "", fmt.Errorf("the function of a step has no name: give it one")
	}
	full := f.Name()
	name := full[strings.LastIndex(full, "/")+1:] // the last element of the package path...
	name = name[strings.Index(name, ".")+1:]      // ... and the package's name
	name = strings.TrimSuffix(name, "-fm")
	name = strings.NewReplacer("(*", "", ")", "", "[...]", "").Replace(name)
	if anonymous.MatchString(name) {
		return "", fmt.Errorf("the step function %s is a function literal, whose name changes with the code "+
			"around it: name the call (Call's name) or use a named function", full)
	}
	return name, nil
}

// records says whether a journal entry recorded for function recorded is a call of
// function now: the same name, or a package-qualified form of it.
func records(recorded, now string) bool {
	return recorded == now || strings.HasSuffix(recorded, "."+now)
}

// take gives the next call (or patch marker) of the body the step id id and the next
// seq, or says why it cannot have them. j.mu is held.
func (j *journal) take(id, function string, limits Limits) error {
	if j.used[id] {
		return fatal("DuplicateStepId", "step id %s is used twice in this durable function (by %s); "+
			"give one of the calls its own with WithStepID", id, function)
	}
	if err := j.next(id, limits); err != nil {
		return err
	}
	j.used[id] = true
	return nil
}

// next gives the call id the next seq, or says that the journal is full. j.mu is held.
func (j *journal) next(id string, limits Limits) error {
	if limit := limits.stepCalls(); int(j.seq) >= limit {
		return fatal("JournalFull", "the durable function made more than %d step calls, the most a node's "+
			"journal holds (the call past it was %s); split the work into child runs (WorkerService.StartChild), "+
			"each with its own journal", limit, id)
	}
	j.seq++
	return nil
}

// matches is nil when the journal agrees with the call c, whose entry at its seq is
// atSeq (nil: none), or the ReplayMismatch that fails the node: it names the call the
// journal recorded and the call the body makes now.
func (c *stepCall) matches(atSeq *cyclonev1.StepCall) error {
	now := fmt.Sprintf("step %q of %s", c.id, c.function)
	var problem string
	switch other := c.step.journal().entry(c.id); {
	case atSeq != nil && atSeq.StepId != c.id:
		problem = fmt.Sprintf("call #%d recorded step %q of %s; this replay makes %s there",
			c.seq, atSeq.StepId, atSeq.Function, now)
	case atSeq == nil && other != nil:
		problem = fmt.Sprintf("step %q of %s was recorded as call #%d; this replay makes %s as call #%d",
			other.StepId, other.Function, other.Seq, now, c.seq)
	case atSeq != nil && !records(atSeq.Function, c.function):
		problem = fmt.Sprintf("call #%d recorded step %q of %s; this replay makes %s there",
			c.seq, atSeq.StepId, atSeq.Function, now)
	default:
		return nil
	}
	return fatal("ReplayMismatch", "the durable function does not replay its journal: %s. The code changed "+
		"under a run in flight, or the body depends on more than its input and its step results. Keep the "+
		"step calls of runs in flight in the same order (or let them finish before deploying), keep a "+
		"renamed step's old name as the name given to Call, or put the change behind Step.Patched", problem)
}

// entry is the journal's entry of step id id, or nil.
func (j *journal) entry(id string) *cyclonev1.StepCall {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.byID[id]
}
