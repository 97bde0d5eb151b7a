// Package worker runs Cyclone handlers and durable functions: it takes steps of the
// actions it serves (on the Work stream, or with Claim where the server has none),
// keeps each lease alive with heartbeats at a third of the lease, runs the handler
// under the step's deadline and reports the outcome.
//
// The rules it follows are the protocol's, the same in every language:
//   - a claim hands out a lease token; every Heartbeat and completion presents it;
//   - Heartbeat answering ABORTED means the lease is lost: the step may already run
//     elsewhere, so the handler is stopped and its outcome dropped;
//   - no heartbeat extends a lease past the node's timeout (ClaimedStep.deadline);
//   - a handler that writes to the Cyclone database can complete inside its own
//     transaction with Step.CompleteInTx instead of a report.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// Handler runs one step. Its return value is the step's output (any JSON-encodable
// value); an error is a failure, retryable unless it is a *Failure with NonRetryable.
// ctx ends at the step's deadline, or earlier when the lease is lost or the run is
// cancelled: a handler that blocks should watch it.
type Handler func(ctx context.Context, step *Step) (output any, err error)

// Action is a handler and the name that nodes call it by.
type Action struct {
	Name    string
	Handler Handler
	// The effect must not happen twice: when a step of it lost its lease with no
	// outcome, the server blocks its run for an operator instead of handing it out.
	UnsafeToRepeat bool
}

// Options tune a Worker; zero values take the defaults.
type Options struct {
	ID          string        // shown in GetRun; default host:pid
	Concurrency int           // handlers running at once; default 4
	Lease       time.Duration // lease asked at claim and at each heartbeat; default 30s
	ClaimWait   time.Duration // long-poll of each Claim; default 10s
	Logger      *slog.Logger
	// The server's payload limit and the journal's size, which outputs and step
	// results are checked against before they are sent; zero fields: the defaults.
	Limits Limits
	// UseClaim speaks the loop with Claim and Complete calls instead of the Work
	// stream. Without it, the worker uses Claim only when the server has no stream.
	UseClaim bool
	// ShardNode pins the worker to one node of a Citus cluster, "host:port" as the
	// cluster names it: it takes only the runs whose shards that node holds. A server
	// that cannot honour it refuses the claims with InvalidArgument, and Run returns
	// that error. Empty: any node. See docs/scaling.md.
	ShardNode string
}

// Worker serves a set of actions. Run it with Run.
type Worker struct {
	client  cyclonev1.WorkerServiceClient
	actions map[string]Action
	opts    Options
	log     *slog.Logger
	inbox   *inbox
}

// New makes a worker of actions on a gRPC connection to a Cyclone server (see
// client.Dial). It checks the actions and the options: an action without a name or a
// handler, a name given twice, or limits out of range are an error naming it.
func New(conn grpc.ClientConnInterface, opts Options, actions ...Action) (*Worker, error) {
	if conn == nil {
		return nil, errors.New("worker: no connection to a server")
	}
	if len(actions) == 0 {
		return nil, errors.New("worker: no action to serve")
	}
	if l := opts.Limits; l.MaxPayloadBytes < 0 || l.MaxStepCalls < 0 || l.MaxStepCalls > MaxStepCalls {
		return nil, fmt.Errorf("worker: limits: MaxPayloadBytes must be positive, MaxStepCalls 1-%d; got %d and %d",
			MaxStepCalls, l.MaxPayloadBytes, l.MaxStepCalls)
	}
	if opts.Concurrency < 0 || opts.Lease < 0 || opts.ClaimWait < 0 {
		return nil, fmt.Errorf("worker: Concurrency, Lease and ClaimWait cannot be negative; got %d, %v and %v",
			opts.Concurrency, opts.Lease, opts.ClaimWait)
	}
	if opts.Lease != 0 && opts.Lease < 3*time.Second {
		return nil, fmt.Errorf("worker: a lease of %v is too short: heartbeats go every third of it; take 3s or more", opts.Lease)
	}
	if opts.ID == "" {
		host, _ := os.Hostname()
		opts.ID = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 4
	}
	if opts.Lease == 0 {
		opts.Lease = 30 * time.Second
	}
	if opts.ClaimWait == 0 {
		opts.ClaimWait = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	w := &Worker{
		client:  cyclonev1.NewWorkerServiceClient(conn),
		actions: make(map[string]Action, len(actions)),
		opts:    opts,
		log:     opts.Logger.With("worker", opts.ID),
	}
	w.inbox = newInbox(w.client, w.log)
	for _, a := range actions {
		switch _, twice := w.actions[a.Name]; {
		case a.Name == "":
			return nil, errors.New("worker: an action has no name")
		case a.Handler == nil:
			return nil, fmt.Errorf("worker: action %q has no handler", a.Name)
		case twice:
			return nil, fmt.Errorf("worker: action %q is given twice", a.Name)
		}
		w.actions[a.Name] = a
	}
	return w, nil
}

// A Claim answered with one of these codes will never succeed as it is: the worker
// stops with the error instead of retrying it.
var permanent = map[codes.Code]bool{
	codes.InvalidArgument: true, codes.PermissionDenied: true, codes.Unauthenticated: true,
	codes.Unimplemented: true, codes.FailedPrecondition: true,
}

// Run claims and runs steps until ctx is done, then waits for the handlers in flight
// to finish (each is bounded by its step's deadline) and returns nil. A server that
// cannot be reached is retried with a backoff up to 5s (it may be restarting); one
// that refuses the claims for good (a bad token, a role without the right, a request
// it rejects) ends Run with that error, once the handlers in flight are done.
//
// A Claim cancelled by the stop may have claimed steps whose answer never arrives:
// they stay leased to nobody until the lease expires, then run again elsewhere.
func (w *Worker) Run(ctx context.Context) error {
	specs := make([]*cyclonev1.ActionSpec, 0, len(w.actions))
	for _, a := range w.actions {
		specs = append(specs, &cyclonev1.ActionSpec{Name: a.Name, UnsafeToRepeat: a.UnsafeToRepeat})
	}
	w.log.Info("worker started", "actions", len(specs), "concurrency", w.opts.Concurrency)
	if !w.opts.UseClaim {
		fallBack, err := w.work(ctx, specs)
		if !fallBack {
			return err
		}
		w.log.Info("the server has no Work stream: claiming with Claim")
	}
	return w.claimLoop(ctx, specs)
}

// claimLoop is the worker's loop with Claim and Complete calls.
func (w *Worker) claimLoop(ctx context.Context, specs []*cyclonev1.ActionSpec) error {

	slots := make(chan struct{}, w.opts.Concurrency) // one token per running handler
	var running sync.WaitGroup
	defer running.Wait()
	retry := newBackoff()
	for {
		// Wait for a free slot, then take every other free one: claim that many steps.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			w.log.Info("worker stopping: waiting for the handlers in flight")
			return nil
		}
		free := 1
		for free < w.opts.Concurrency && len(slots) < cap(slots) {
			slots <- struct{}{}
			free++
		}
		steps, err := w.claim(ctx, specs, free)
		for range free - len(steps) {
			<-slots
		}
		if err != nil {
			if ctx.Err() != nil {
				continue // stopping
			}
			if permanent[status.Code(err)] {
				w.log.Error("the server refuses this worker's claims; stopping", "error", err)
				return fmt.Errorf("worker: Claim refused: %w", err)
			}
			delay := retry.next()
			w.log.Warn("claim failed; retrying", "error", err, "in", delay)
			sleep(ctx, delay)
			continue
		}
		retry.reset()
		for _, claimed := range steps {
			running.Add(1)
			go func() {
				defer func() { <-slots; running.Done() }()
				w.runStep(&Step{ClaimedStep: claimed, client: w.client, limits: w.opts.Limits})
			}()
		}
	}
}

func (w *Worker) claim(ctx context.Context, specs []*cyclonev1.ActionSpec, n int) ([]*cyclonev1.ClaimedStep, error) {
	// The call's deadline covers the long-poll plus a margin for the answer.
	callCtx, cancel := context.WithTimeout(ctx, w.opts.ClaimWait+10*time.Second)
	defer cancel()
	resp, err := w.client.Claim(callCtx, &cyclonev1.ClaimRequest{
		WorkerId:  w.opts.ID,
		Actions:   specs,
		MaxSteps:  int32(n),
		Wait:      durationpb.New(w.opts.ClaimWait),
		Lease:     durationpb.New(w.opts.Lease),
		ShardNode: w.opts.ShardNode,
	})
	if err != nil {
		return nil, err
	}
	// Runs this claim blocked instead of handing out a step (an unsafe action's step
	// lost its lease with no outcome): they wait for an operator, so say so.
	for _, b := range resp.Blocked {
		w.log.Warn("run blocked: its step is unsafe to repeat and may have had its effect",
			"run_id", b.RunId, "node", b.Node, "attempt", b.Attempt, "step_id", b.StepId,
			"reason", b.Reason)
	}
	return resp.Steps, nil
}

// runStep runs one claimed step's handler with heartbeats, then reports its outcome.
func (w *Worker) runStep(step *Step) { w.runStepThen(step, w.report) }

// reporter sends a step's outcome: with Complete, or in a report of the Work stream.
type reporter func(req *cyclonev1.CompleteRequest, step *Step, log *slog.Logger)

// runStepThen runs one claimed step's handler with heartbeats, then hands its outcome
// to report; a step whose outcome is dropped (or committed in its transaction)
// reports nothing.
func (w *Worker) runStepThen(step *Step, report reporter) {
	log := w.log.With("run_id", step.RunId, "node", step.Node, "attempt", step.Attempt)
	step.log = log
	step.inbox = w.inbox
	action, ok := w.actions[step.Action]
	if !ok { // the server only hands out the actions we claimed
		log.Error("claimed a step of an action this worker does not serve", "action", step.Action)
		return
	}
	// The handler's context ends at the deadline, or when a heartbeat learns that the
	// lease is lost or the run cancelled (context.Cause says which).
	base, stop := context.WithCancelCause(context.Background())
	ctx, cancel := context.WithDeadline(base, step.GetDeadline().AsTime())
	defer cancel()
	// A traced run's step: its handler runs in a span, ended with the outcome below.
	ctx, span := startStepSpan(ctx, step, w.opts.ID)
	outcome, spanErr := "dropped", error(nil)
	defer func() { endStepSpan(span, outcome, spanErr) }()
	step.cancel = stop // a durable function's step calls may stop it too
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		w.heartbeat(ctx, step, stop, log)
	}()

	log.Info("step started", "action", step.Action)
	output, err := callHandler(ctx, action.Handler, step)
	cause := context.Cause(ctx)
	stop(nil) // the handler returned: stop heartbeating
	<-beating
	w.inbox.finish(step) // its queries' last values are published before its outcome
	if stopped := step.stopped(); stopped != nil {
		err = stopped // a step call stopped the body: that decides, not what it returned
	}

	switch {
	case step.completedInTx:
		outcome = "completed"
		log.Info("step completed in its transaction")
	case errors.Is(err, ErrLeaseLost) || errors.Is(cause, ErrLeaseLost):
		log.Warn("lease lost: outcome dropped, the step runs again elsewhere", "error", err)
	case errors.Is(err, ErrSuspended):
		outcome = "suspended"
		log.Info("waiting: the node gave up its lease until it can go on", "wait", err)
	case errors.Is(err, ErrEffectUncertain):
		log.Warn("effect uncertain: the run is blocked until an operator resolves it; node dropped", "error", err)
	case errors.Is(cause, ErrRunCancelled):
		log.Info("run cancelled: outcome dropped")
	default:
		if err == nil {
			var value *structpb.Value
			if value, err = outputValue(output); err == nil {
				err = outputTooLarge(value, step.limits)
			}
			if err == nil {
				req := completeRequest(step)
				req.Outcome = &cyclonev1.CompleteRequest_Output{Output: value}
				outcome = "completed"
				report(req, step, log)
				return
			}
		}
		if errors.Is(cause, context.DeadlineExceeded) {
			err = &Failure{Type: "HandlerTimeout", Message: "the handler ran past the node's timeout"}
		}
		log.Warn("step failed", "error", err)
		outcome, spanErr = "failed", err
		req := completeRequest(step)
		req.Outcome = &cyclonev1.CompleteRequest_Failure{Failure: failure(err)}
		report(req, step, log)
	}
}

// callHandler runs the handler, turning a panic into a failure.
func callHandler(ctx context.Context, h Handler, step *Step) (output any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &Failure{Type: "panic", Message: fmt.Sprint(p)}
		}
	}()
	return h(ctx, step)
}

// heartbeat extends the lease every third of it until ctx ends. ABORTED (lease lost)
// and a cancelled run stop the handler through stop; other errors (the server
// restarting...) are retried at the next beat while the lease may still hold.
func (w *Worker) heartbeat(ctx context.Context, step *Step, stop context.CancelCauseFunc, log *slog.Logger) {
	every := w.opts.Lease / 3
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		callCtx, cancel := context.WithTimeout(ctx, every)
		lines := step.logs.take()
		resp, err := w.client.Heartbeat(callCtx, &cyclonev1.HeartbeatRequest{
			RunId:      step.RunId,
			Node:       step.Node,
			LeaseToken: step.LeaseToken,
			Lease:      durationpb.New(w.opts.Lease),
			Logs:       lines,
		})
		cancel()
		if err != nil {
			step.logs.giveBack(lines) // the next beat carries them again
		}
		switch status.Code(err) {
		case codes.OK:
			if resp.Cancelled {
				stop(ErrRunCancelled)
				return
			}
		case codes.Aborted, codes.NotFound:
			stop(&leaseLost{reason: status.Convert(err).Message()})
			return
		default:
			if ctx.Err() == nil {
				log.Warn("heartbeat failed; retrying at the next beat", "error", err)
			}
		}
	}
}

// report sends the outcome with Complete, retrying while the server is unreachable
// and the step's deadline has not passed.
func (w *Worker) report(req *cyclonev1.CompleteRequest, step *Step, log *slog.Logger) {
	ctx, cancel := context.WithDeadline(context.Background(), step.GetDeadline().AsTime().Add(time.Minute))
	defer cancel()
	retry := newBackoff()
	for {
		resp, err := w.client.Complete(ctx, req)
		switch code := status.Code(err); {
		case code == codes.OK:
			log.Info("step reported", "status", resp.Status.String(), "run_status", resp.RunStatus.String())
			return
		case code == codes.Aborted:
			log.Warn("completion refused: lease lost", "error", status.Convert(err).Message())
			return
		case code == codes.Unavailable && ctx.Err() == nil:
			sleep(ctx, retry.next())
		default:
			log.Error("completion failed", "error", err)
			return
		}
	}
}

// completeRequest names the step and presents its lease token; the caller sets the outcome.
func completeRequest(step *Step) *cyclonev1.CompleteRequest {
	return &cyclonev1.CompleteRequest{RunId: step.RunId, Node: step.Node, LeaseToken: step.LeaseToken,
		Logs: step.logs.take()}
}

// failure is the node's failure for err: a *Failure's type and retry mark, else the
// error's Go type, retryable; texts made to fit what the server takes, so that a
// long or odd message never gets the report refused.
func failure(err error) *cyclonev1.Failure {
	rec := errorRecord(err)
	var f *Failure
	return &cyclonev1.Failure{Type: rec.Type, Message: rec.Message, Details: rec.Details,
		NonRetryable: errors.As(err, &f) && f.NonRetryable}
}

// backoff is an exponential delay from 100ms to 5s.
type backoff struct{ delay time.Duration }

func newBackoff() *backoff { return &backoff{} }

func (b *backoff) reset() { b.delay = 0 }

func (b *backoff) next() time.Duration {
	b.delay = min(max(2*b.delay, 100*time.Millisecond), 5*time.Second)
	return b.delay
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
