package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// The Work stream: the same loop as Claim and Complete, on one stream. The worker
// grants credit for its free slots, the server sends steps as they become ready, and
// the outcomes go back in reports (CompleteManyRequest), one on its way at a time,
// each granting the credit of the slots it frees. Heartbeats stay unary calls. When
// the stream breaks, the reports it did not answer go with CompleteMany, and a new
// stream opens; a server without Work answers UNIMPLEMENTED, and the worker claims
// with Claim instead.

// outcome is a finished handler's report, or nil when it reports nothing.
type outcome struct {
	req  *cyclonev1.CompleteRequest
	step *Step
	log  *slog.Logger
}

// workState is what outlives one stream: the handlers running and their outcomes.
type workState struct {
	running int
	done    chan outcome
	pending []outcome // outcomes not sent yet
	alone   int32     // slots freed without a report, not granted yet
}

// work runs Work streams until ctx ends (then it waits for the handlers in flight and
// returns nil), or says to fall back to Claim when the server has no stream.
func (w *Worker) work(ctx context.Context, specs []*cyclonev1.ActionSpec) (fallBack bool, err error) {
	st := &workState{done: make(chan outcome, w.opts.Concurrency)}
	retry := newBackoff()
	for {
		opened, err := w.session(ctx, specs, st)
		if ctx.Err() != nil && st.running == 0 && len(st.pending) == 0 {
			return false, nil
		}
		switch code := status.Code(err); {
		case code == codes.Unimplemented && !opened:
			w.finish(st) // nothing was handed out: nothing runs
			return true, nil
		case permanent[code]:
			w.finish(st)
			return false, err
		case err != nil:
			w.log.Warn("work stream broke; opening another", "error", err)
		}
		if opened {
			retry.reset()
		}
		sleep(ctx, retry.next())
		if ctx.Err() != nil {
			w.finish(st)
			return false, nil
		}
	}
}

// finish waits for the handlers in flight and reports their outcomes with Complete.
func (w *Worker) finish(st *workState) {
	for _, o := range st.pending {
		w.report(o.req, o.step, o.log)
	}
	st.pending = nil
	for ; st.running > 0; st.running-- {
		if o := <-st.done; o.req != nil {
			w.report(o.req, o.step, o.log)
		}
	}
}

// session speaks one Work stream. It returns when the stream ends, or when ctx has
// ended and every handler has reported; opened says whether the server answered.
func (w *Worker) session(ctx context.Context, specs []*cyclonev1.ActionSpec, st *workState) (opened bool, err error) {
	streamCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stream, err := w.client.Work(streamCtx)
	if err != nil {
		return false, err
	}
	credit := int32(w.opts.Concurrency - st.running - len(st.pending))
	if ctx.Err() != nil {
		credit = 0
	}
	st.alone = 0
	err = stream.Send(&cyclonev1.WorkRequest{Credit: credit,
		Open: &cyclonev1.WorkOpen{WorkerId: w.opts.ID, Actions: specs, Lease: durationpb.New(w.opts.Lease),
			ShardNode: w.opts.ShardNode}})
	if err != nil {
		return false, err
	}
	responses := make(chan *cyclonev1.WorkResponse)
	ended := make(chan error, 1)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			select {
			case responses <- resp:
			case <-streamCtx.Done():
				return
			}
		}
	}()

	var inFlight []outcome // the report sent and not answered yet
	stopping := ctx.Done()
	closed := false
	send := func() error {
		if inFlight == nil && len(st.pending) > 0 {
			req := &cyclonev1.WorkRequest{Report: &cyclonev1.CompleteManyRequest{}}
			for _, o := range st.pending {
				req.Report.Completions = append(req.Report.Completions, o.req)
			}
			if ctx.Err() == nil {
				req.Credit = int32(len(st.pending)) + st.alone
				st.alone = 0
			}
			if err := stream.Send(req); err != nil {
				return err
			}
			inFlight, st.pending = st.pending, nil
		}
		if st.alone > 0 && ctx.Err() == nil {
			if err := stream.Send(&cyclonev1.WorkRequest{Credit: st.alone}); err != nil {
				return err
			}
			st.alone = 0
		}
		if ctx.Err() != nil && !closed && st.running == 0 && len(st.pending) == 0 && inFlight == nil {
			closed = true // everything is reported: the server ends the stream
			return stream.CloseSend()
		}
		return nil
	}
	for {
		select {
		case resp := <-responses:
			opened = true
			if resp.Report != nil {
				w.answered(inFlight, resp.Report)
				inFlight = nil
			}
			for _, b := range resp.Blocked {
				w.log.Warn("run blocked: its step is unsafe to repeat and may have had its effect",
					"run_id", b.RunId, "node", b.Node, "attempt", b.Attempt, "step_id", b.StepId, "reason", b.Reason)
			}
			for _, claimed := range resp.Steps {
				st.running++
				go func() {
					step := &Step{ClaimedStep: claimed, client: w.client, limits: w.opts.Limits}
					var out outcome
					w.runStepThen(step, func(req *cyclonev1.CompleteRequest, step *Step, log *slog.Logger) {
						out = outcome{req: req, step: step, log: log}
					})
					st.done <- out
				}()
			}
		case o := <-st.done:
			st.running--
			if o.req != nil {
				st.pending = append(st.pending, o)
			} else {
				st.alone++
			}
		case <-stopping:
			stopping = nil // stop granting credit; the handlers in flight finish
		case err := <-ended:
			// The reports not answered go with CompleteMany; the stream reopens.
			st.pending = append(inFlight, st.pending...)
			if len(st.pending) > 0 {
				w.completeMany(st)
			}
			if errors.Is(err, io.EOF) {
				err = nil // the server is stopping, or we closed: open another
			}
			if ctx.Err() != nil && err == nil && st.running == 0 {
				return opened, nil
			}
			return opened, err
		}
		if err := send(); err != nil {
			// The stream is broken: its end arrives on ended.
			w.log.Debug("work stream send failed", "error", err)
		}
	}
}

// answered logs what the server said of each completion of a report.
func (w *Worker) answered(sent []outcome, report *cyclonev1.CompleteManyResponse) {
	for i, result := range report.Results {
		if i >= len(sent) {
			break
		}
		log := sent[i].log
		if e := result.GetError(); e != nil {
			if codes.Code(e.Code) == codes.Aborted {
				log.Warn("completion refused: lease lost", "error", e.Message)
			} else {
				log.Error("completion failed", "error", e.Message, "code", codes.Code(e.Code).String())
			}
			continue
		}
		resp := result.GetResponse()
		log.Info("step reported", "status", resp.GetStatus().String(), "run_status", resp.GetRunStatus().String())
	}
}

// completeMany sends the pending outcomes with CompleteMany, retried while the server
// is unreachable; an outcome it cannot deliver is left to its lease.
func (w *Worker) completeMany(st *workState) {
	sent := st.pending
	st.pending = nil
	req := &cyclonev1.CompleteManyRequest{}
	for _, o := range sent {
		req.Completions = append(req.Completions, o.req)
	}
	resp, err := retryUnavailable(context.Background(), func(ctx context.Context) (*cyclonev1.CompleteManyResponse, error) {
		return w.client.CompleteMany(ctx, req)
	})
	if err != nil {
		w.log.Error("completions lost with the stream; their steps run again when their leases expire",
			"error", err, "steps", len(sent))
		return
	}
	w.answered(sent, resp)
}
