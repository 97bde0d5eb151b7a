package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// pollWait is how long one Inbox of the poller waits for a query or an update.
const pollWait = 2 * time.Second

type nodeKey struct{ run, node string }

// inbox carries the queries and updates of the durable functions a worker runs,
// through WorkerService.Inbox. While bodies that registered a handler run, one
// goroutine long-polls Inbox with their nodes: it answers their queries at once from
// their query handlers, and hands their updates to the bodies, which apply them at
// their next journal point. Answers and published values go in short Inbox calls of
// their own as soon as they are ready. A body without handlers costs nothing here.
type inbox struct {
	client cyclonev1.WorkerServiceClient
	log    *slog.Logger

	sendMu    sync.Mutex // held while answers and values are sent
	mu        sync.Mutex
	bodies    map[nodeKey]*inboxBody
	polling   bool
	sending   bool
	answers   []*cyclonev1.QueryAnswer
	published map[[3]string]*cyclonev1.PublishedQuery
	// The server has no Inbox: queries and updates are not served.
	unsupported bool
}

type inboxBody struct {
	step   *Step
	cursor int64 // the highest update seq handed to this body
}

func newInbox(client cyclonev1.WorkerServiceClient, log *slog.Logger) *inbox {
	return &inbox{client: client, log: log, bodies: map[nodeKey]*inboxBody{}, published: map[[3]string]*cyclonev1.PublishedQuery{}}
}

// activate: the body registered a handler; it takes queries and updates.
func (b *inbox) activate(s *Step) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := nodeKey{s.RunId, s.Node}
	if body := b.bodies[key]; body == nil || body.step != s {
		b.bodies[key] = &inboxBody{step: s}
	}
	if !b.polling && !b.unsupported {
		b.polling = true
		go b.poll()
	}
}

// finish: the body ended. Its last values are published, now (so a query after the
// outcome finds them), and it takes no more queries.
func (b *inbox) finish(s *Step) {
	if s.handlers == nil {
		return
	}
	b.mu.Lock()
	key := nodeKey{s.RunId, s.Node}
	if body := b.bodies[key]; body != nil && body.step == s {
		delete(b.bodies, key)
	}
	b.mu.Unlock()
	s.publish()
	b.flush()
}

func (b *inbox) publish(s *Step, values map[string]*structpb.Value) {
	b.mu.Lock()
	for name, value := range values {
		b.published[[3]string{s.RunId, s.Node, name}] = &cyclonev1.PublishedQuery{
			RunId: s.RunId, Node: s.Node, Attempt: s.Attempt, Name: name, Value: value,
		}
	}
	b.mu.Unlock()
	b.sendSoon()
}

func (b *inbox) sendSoon() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.sending {
		b.sending = true
		go func() {
			b.flush()
			b.mu.Lock()
			b.sending = false
			again := len(b.answers) > 0 || len(b.published) > 0
			b.mu.Unlock()
			if again {
				b.sendSoon()
			}
		}()
	}
}

// flush sends the answers and published values there are, in Inbox calls that name
// no node (they do not wait), once those being sent are sent.
func (b *inbox) flush() {
	b.sendMu.Lock()
	defer b.sendMu.Unlock()
	for {
		b.mu.Lock()
		if len(b.answers) == 0 && len(b.published) == 0 {
			b.mu.Unlock()
			return
		}
		req := &cyclonev1.InboxRequest{Answers: b.answers}
		for _, p := range b.published {
			req.Published = append(req.Published, p)
		}
		b.answers, b.published = nil, map[[3]string]*cyclonev1.PublishedQuery{}
		b.mu.Unlock()
		if _, err := b.call(context.Background(), req); err != nil {
			// The asker times out; the next values go later.
			b.log.Warn("Inbox could not send answers or query values", "error", err)
			return
		}
	}
}

func (b *inbox) call(ctx context.Context, req *cyclonev1.InboxRequest) (*cyclonev1.InboxResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+req.GetWait().AsDuration())
	defer cancel()
	return b.client.Inbox(ctx, req)
}

// fetch hands the body s the updates (and queries) waiting for it now: it is about
// to wait, and the node's lease goes with the Wait. A failure is logged: the update
// is then applied at the node's next wake, which the server makes at once.
func (b *inbox) fetch(ctx context.Context, s *Step) {
	resp, err := b.call(ctx, &cyclonev1.InboxRequest{Nodes: []*cyclonev1.InboxNode{{RunId: s.RunId, Node: s.Node}}})
	if err != nil {
		if status.Code(err) != codes.Unimplemented {
			b.log.Warn("Inbox could not fetch the updates of a body", "run_id", s.RunId, "node", s.Node, "error", err)
		}
		return
	}
	b.handle(resp)
}

// poll long-polls Inbox while bodies with handlers run.
func (b *inbox) poll() {
	retry := newBackoff()
	for {
		b.mu.Lock()
		if len(b.bodies) == 0 {
			b.polling = false
			b.mu.Unlock()
			return
		}
		req := &cyclonev1.InboxRequest{Wait: durationpb.New(pollWait)}
		for key, body := range b.bodies {
			req.Nodes = append(req.Nodes, &cyclonev1.InboxNode{RunId: key.run, Node: key.node, AfterUpdate: body.cursor})
		}
		b.mu.Unlock()
		resp, err := b.call(context.Background(), req)
		if status.Code(err) == codes.Unimplemented {
			b.log.Warn("the server has no Inbox: queries and updates are not served")
			b.mu.Lock()
			b.polling, b.unsupported = false, true
			b.mu.Unlock()
			return
		}
		if err != nil {
			b.log.Warn("Inbox failed", "error", err)
			time.Sleep(retry.next())
			continue
		}
		retry.reset()
		b.handle(resp)
	}
}

func (b *inbox) handle(resp *cyclonev1.InboxResponse) {
	for _, u := range resp.Updates {
		b.mu.Lock()
		body := b.bodies[nodeKey{u.RunId, u.Node}]
		if body != nil {
			body.cursor = max(body.cursor, u.Seq)
		}
		b.mu.Unlock()
		if body != nil {
			body.step.handlers.deliver(delivered{id: u.UpdateId, name: u.Name, args: u.Args})
		}
	}
	for _, q := range resp.Queries {
		answer := &cyclonev1.QueryAnswer{QueryId: q.QueryId, RunId: q.RunId}
		b.mu.Lock()
		body := b.bodies[nodeKey{q.RunId, q.Node}]
		b.mu.Unlock()
		if body == nil {
			answer.ErrorType, answer.ErrorMessage = "NotRunning", "node "+q.Node+" is not running on this worker any more"
		} else {
			answer.Result, answer.ErrorType, answer.ErrorMessage = body.step.handlers.answer(q.Name, q.Args)
		}
		b.mu.Lock()
		b.answers = append(b.answers, answer)
		b.mu.Unlock()
	}
	if len(resp.Queries) > 0 {
		b.sendSoon()
	}
}
