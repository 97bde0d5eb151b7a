package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// A handler is a durable function when it runs parts of its work through Call: each
// call is a step call, recorded in the node's journal under a step id that is the
// same on every replay. When the node runs again (a retry, a lease reclaim, after an
// operator's Resolve), the handler runs from the top, and Call answers the calls the
// journal already holds from the journal (a success returns the recorded value, a
// failure the recorded error) without running them again. So the handler must call
// its steps in the same order every time, from its own goroutine.
//
// The journal comes with the claim (ClaimedStep.Journal). A safe call that has no
// outcome runs and is then recorded with EndStepCall; it may run again if the worker
// dies before that. A call marked UnsafeToRepeat is first recorded STARTED with
// BeginStepCall, before it runs; if a later attempt finds it STARTED with no
// outcome, the server blocks the run (EffectUncertain) for an operator to resolve,
// and Call returns ErrEffectUncertain: the worker drops the node without a Complete.

// ErrEffectUncertain: an unsafe step call was begun by an earlier attempt and has no
// outcome, so its effect may have happened. The server made the node uncertain and
// blocked its run; the handler's context is cancelled and the worker reports nothing.
var ErrEffectUncertain = errors.New("effect uncertain")

// CallOption changes one step call.
type CallOption func(*callOptions)

type callOptions struct {
	unsafe    bool
	stepID    string
	digest    string // WithArgs's digest, "" for none
	digestErr error  // why WithArgs could not digest the arguments
}

// UnsafeToRepeat marks a step call whose effect must never happen twice: it is
// recorded STARTED before it runs, and a replay that finds it STARTED blocks the run
// instead of running it again. The mark is read from the code that runs now.
func UnsafeToRepeat() CallOption { return func(o *callOptions) { o.unsafe = true } }

// WithStepID names the call explicitly instead of "name", "name#2", ... by order of
// occurrence.
func WithStepID(id string) CallOption { return func(o *callOptions) { o.stepID = id } }

// journal is a node's step calls as this attempt knows them, and the counters that
// give each new call its seq and step id.
type journal struct {
	mu         sync.Mutex
	byID       map[string]*cyclonev1.StepCall
	bySeq      map[int32]*cyclonev1.StepCall
	seq        int32
	occurred   map[string]int
	used       map[string]bool // the step ids of this attempt's calls and patch markers
	lastSeq    int32           // the claimed journal's last seq
	hasUpdates bool            // the claimed journal records the application of an update
	// The node must stop: its effect is uncertain, its lease is lost, or the body
	// called steps out of the recorded order. Every later call returns it.
	stopped error
}

func (s *Step) journal() *journal {
	s.journalOnce.Do(func() {
		j := &journal{
			byID:     make(map[string]*cyclonev1.StepCall),
			bySeq:    make(map[int32]*cyclonev1.StepCall),
			occurred: make(map[string]int),
			used:     make(map[string]bool),
		}
		for _, c := range s.Journal {
			j.byID[c.StepId] = c
			j.bySeq[c.Seq] = c
			j.lastSeq = max(j.lastSeq, c.Seq)
			j.hasUpdates = j.hasUpdates || c.Function == updateFunction
		}
		s.steps = j
	})
	return s.steps
}

// a pending step call: its place in the body and what the journal says of it.
type stepCall struct {
	step     *Step
	id       string
	seq      int32
	function string
	unsafe   bool
	digest   string              // of the call's arguments (WithArgs), "" for none
	recorded *cyclonev1.StepCall // nil when the journal holds nothing for it
}

// Call runs fn as the step call name of the durable function s, or answers it from
// the journal. The value is what fn returned, passed through JSON as a replay would
// decode it. A failure comes back as a *Failure read from what the journal recorded
// (the same on the first run and on replays): the original type and message, and
// the error rebuilt when this package knows it (errors.As finds a
// *StepResultTooLarge). Outside a durable function (s nil), fn simply runs.
//
// name is what the journal records as the called function and the base of the step
// ids of its calls; empty, it is fn's own name without its package path
// ("priceOrder", "orders.charge" for a method), which needs a named function: a
// function literal has no name that stays the same when the code around it changes.
func Call[T any](ctx context.Context, s *Step, name string, fn func(context.Context) (T, error), opts ...CallOption) (T, error) {
	var zero T
	if s == nil {
		return fn(ctx)
	}
	c, err := s.begin(ctx, name, fn, opts)
	if err != nil || c.recorded != nil {
		return replayed[T](c.atPoint(ctx, err))
	}
	// The function's chunks (Step.Emit) are identified by the call's step id.
	out, fnErr := fn(context.WithValue(ctx, stepCallKey{}, c.id))
	if fnErr != nil && ctx.Err() != nil {
		// The node is stopping (lease lost, cancelled, deadline): record nothing. A
		// safe call runs again in the next attempt; an unsafe one is uncertain there.
		return zero, fnErr
	}
	var value *structpb.Value
	if fnErr == nil {
		if value, err = toValue(out); err != nil {
			return zero, s.stop(fatal("StepCallError", "the return value of step call %s is not JSON: %v", c.id, err))
		}
		if fnErr = c.tooLarge(value); fnErr != nil {
			value = nil
		}
	}
	c, err = c.end(ctx, value, fnErr)
	return replayed[T](c.atPoint(ctx, err))
}

// tooLarge is the failure of the call when its result is over the payload limit:
// it is recorded as the call's failure instead of the result, which the server would
// refuse.
func (c *stepCall) tooLarge(value *structpb.Value) error {
	limit := c.step.limits.payload()
	if size := proto.Size(value); size > limit {
		return &StepResultTooLarge{StepID: c.id, Function: c.function, Size: size, Limit: limit}
	}
	return nil
}

// replayed turns a recorded entry into what Call returns.
func replayed[T any](c *stepCall, err error) (T, error) {
	var out T
	if err != nil {
		return out, err
	}
	if c.recorded.GetStatus() == cyclonev1.StepCallStatus_STEP_CALL_STATUS_FAILED {
		return out, recordedFailure(c.recorded.GetError())
	}
	if err := decode(c.recorded.GetOutput(), &out); err != nil {
		return out, fmt.Errorf("step call %s: the recorded output does not decode: %w", c.recorded.GetStepId(), err)
	}
	return out, nil
}

// begin gives the call its seq and step id, checks that the journal agrees with the
// body, and finds its outcome: from the claimed journal, or for an unsafe call from
// BeginStepCall. c.recorded stays nil when the call must run.
func (s *Step) begin(ctx context.Context, name string, fn any, opts []CallOption) (*stepCall, error) {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	function, err := stepName(name, fn)
	if err != nil {
		return nil, s.stop(fatal("InvalidStepName", "%v", err))
	}
	if o.digestErr != nil {
		return nil, s.stop(fatal("ArgumentsNotJson", "step %s: its arguments (WithArgs) are not JSON: %v", function, o.digestErr))
	}
	c, err := s.open(function, function, o)
	if err != nil {
		return nil, err
	}
	c.digest = o.digest
	if recorded := c.recorded.GetArgsDigest(); recorded != "" && c.digest != "" && recorded != c.digest {
		return nil, s.stop(fatal("ReplayMismatch",
			"step call %s of %s is recorded with other arguments: its arguments changed since (digest %.12s recorded, %.12s now)",
			c.id, c.function, recorded, c.digest))
	}
	if c.recorded.GetStatus() == cyclonev1.StepCallStatus_STEP_CALL_STATUS_STARTED {
		// Begun by an unsafe call with no outcome. Only BeginStepCall may decide
		// whether it runs; a call the code no longer marks unsafe runs again.
		c.recorded = nil
	}
	if c.recorded != nil || !c.unsafe {
		return c, nil
	}
	resp, err := retryUnavailable(ctx, func(ctx context.Context) (*cyclonev1.BeginStepCallResponse, error) {
		return s.client.BeginStepCall(ctx, c.beginRequest(true))
	})
	if err != nil {
		return nil, s.refused("BeginStepCall", c, err)
	}
	switch resp.Decision {
	case cyclonev1.StepCallDecision_STEP_CALL_DECISION_RUN:
	case cyclonev1.StepCallDecision_STEP_CALL_DECISION_RECORDED:
		c.recorded = resp.Call
	case cyclonev1.StepCallDecision_STEP_CALL_DECISION_UNCERTAIN:
		return nil, s.stop(fmt.Errorf("%w: step call %s was begun at attempt %d and has no outcome; run %s is blocked",
			ErrEffectUncertain, c.id, resp.Call.GetAttempt(), s.RunId))
	default:
		return nil, fmt.Errorf("BeginStepCall for %s: unknown decision %v", c.id, resp.Decision)
	}
	return c, nil
}

// open gives the next call of the body, of function, its seq and its step id (o's,
// else base, base#2, ... by occurrence), checks that the journal agrees, and finds
// what the claimed journal holds for it (c.recorded, nil when nothing).
func (s *Step) open(function, base string, o callOptions) (*stepCall, error) {
	if o.stepID != "" {
		if err := checkName("step id", o.stepID, maxName); err != nil {
			return nil, s.stop(fatal("InvalidStepName", "%v", err))
		}
	}
	j := s.journal()
	j.mu.Lock()
	if j.stopped != nil {
		j.mu.Unlock()
		return nil, j.stopped
	}
	id := o.stepID
	if id == "" {
		id = base
		if n := j.occurred[base] + 1; n > 1 {
			id = fmt.Sprintf("%s#%d", base, n)
		}
	}
	if err := j.take(id, function, s.limits); err != nil {
		j.mu.Unlock()
		return nil, s.stop(err)
	}
	j.occurred[base]++
	c := &stepCall{step: s, id: id, seq: j.seq, function: function, unsafe: o.unsafe, recorded: j.byID[id]}
	atSeq := j.bySeq[c.seq]
	j.mu.Unlock()

	if err := c.matches(atSeq); err != nil {
		return nil, s.stop(err)
	}
	if atSeq != nil {
		// The journal's name for the function stands (an older form of it).
		c.function = atSeq.Function
	}
	return c, nil
}

// end records the call's outcome with EndStepCall and returns the entry as recorded:
// the first outcome stands when the call already had one.
func (c *stepCall) end(ctx context.Context, value *structpb.Value, fnErr error) (*stepCall, error) {
	s := c.step
	req := &cyclonev1.EndStepCallRequest{
		RunId: s.RunId, Node: s.Node, LeaseToken: s.LeaseToken,
		StepId: c.id, Seq: c.seq, Function: c.function, UnsafeToRepeat: c.unsafe, ArgsDigest: c.digest,
	}
	if fnErr != nil {
		req.Outcome = &cyclonev1.EndStepCallRequest_Error{Error: errorRecord(fnErr)}
	} else {
		req.Outcome = &cyclonev1.EndStepCallRequest_Output{Output: value}
	}
	resp, err := retryUnavailable(ctx, func(ctx context.Context) (*cyclonev1.EndStepCallResponse, error) {
		return s.client.EndStepCall(ctx, req)
	})
	if err != nil {
		return nil, s.refused("EndStepCall", c, err)
	}
	return c.remember(resp.Call), nil
}

func (c *stepCall) beginRequest(unsafe bool) *cyclonev1.BeginStepCallRequest {
	s := c.step
	return &cyclonev1.BeginStepCallRequest{
		RunId: s.RunId, Node: s.Node, LeaseToken: s.LeaseToken,
		StepId: c.id, Seq: c.seq, Function: c.function, UnsafeToRepeat: unsafe, ArgsDigest: c.digest,
	}
}

// remember keeps the call's recorded entry in the journal of this attempt.
func (c *stepCall) remember(entry *cyclonev1.StepCall) *stepCall {
	j := c.step.journal()
	j.mu.Lock()
	j.byID[c.id], j.bySeq[c.seq] = entry, entry
	j.mu.Unlock()
	return &stepCall{step: c.step, id: c.id, seq: c.seq, function: c.function, digest: c.digest, recorded: entry}
}

// refused turns an error of BeginStepCall or EndStepCall into what the body gets: a
// lost lease stops the node (the worker drops it), a refused request (a bug: bad
// values, too many calls) fails it for good, anything else is an ordinary error.
func (s *Step) refused(rpc string, c *stepCall, err error) error {
	switch status.Code(err) {
	case codes.Aborted, codes.NotFound:
		return s.stop(&leaseLost{reason: status.Convert(err).Message()})
	case codes.InvalidArgument, codes.FailedPrecondition:
		return s.stop(fatal("StepCallError", "%s refused step call %s: %s", rpc, c.id, status.Convert(err).Message()))
	}
	return fmt.Errorf("%s for step call %s: %w", rpc, c.id, err)
}

// fatal is a failure that no retry can fix: the node is discarded with it, whatever
// the body does with the error.
func fatal(typ, format string, args ...any) error {
	return &Failure{Type: typ, Message: fmt.Sprintf(format, args...), NonRetryable: true}
}

// stop ends the body: every later Call returns err, the handler's context is
// cancelled with err as its cause, and the worker reports the node by the cause (a
// *Failure is reported as such; an uncertain effect or a lost lease, nothing).
func (s *Step) stop(err error) error {
	j := s.journal()
	j.mu.Lock()
	if j.stopped == nil {
		j.stopped = err
	}
	err = j.stopped
	j.mu.Unlock()
	if s.cancel != nil {
		s.cancel(err)
	}
	return err
}

// stopped is why the body was stopped, or nil.
func (s *Step) stopped() error {
	if s.steps == nil {
		return nil
	}
	s.steps.mu.Lock()
	defer s.steps.mu.Unlock()
	return s.steps.stopped
}

// retryUnavailable calls rpc until it answers something else than UNAVAILABLE (the
// server restarting) or ctx ends. Both step call RPCs are safe to repeat.
func retryUnavailable[R any](ctx context.Context, rpc func(context.Context) (R, error)) (R, error) {
	retry := newBackoff()
	for {
		callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := rpc(callCtx)
		cancel()
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return resp, err
		}
		sleep(ctx, retry.next())
	}
}
