package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// Queries and updates (docs/durable-functions.md, "Queries and updates"): a body
// registers handlers as closures over its own state. A query handler reads; the
// worker runs it at once when a client asks (client.Query), on the worker's own
// goroutine while the body runs, so it must guard what it shares with the body (a
// sync.Mutex). An update handler changes the state: the body runs it on its own
// goroutine at its next journal point (a step call returning, a wait), and the
// journal records it there (step id "update:<update id>", function
// "cyclone.update", output {"update", "args", "result"} or {..., "error": {"type",
// "message"}}), so a replay runs it again at the same point with the recorded
// arguments, before the body's code after it, and it is never applied twice. The
// values of query handlers without arguments are published at each journal point
// where they changed and when the body ends, for client.Query to answer while no
// worker runs the body.

const (
	updateFunction = "cyclone.update"
	updatePrefix   = "update:"
)

// Args are the JSON arguments of a query or an update, in order.
type Args []json.RawMessage

// Decode decodes the arguments into vs (pointers, as for json.Unmarshal), one each; a
// count or a type that does not fit is a *Failure of type BadArguments, the caller's
// answer when the handler returns it.
func (a Args) Decode(vs ...any) error {
	if len(a) != len(vs) {
		return &Failure{Type: "BadArguments", Message: fmt.Sprintf("takes %d arguments, got %d", len(vs), len(a))}
	}
	for i, raw := range a {
		if err := json.Unmarshal(raw, vs[i]); err != nil {
			return &Failure{Type: "BadArguments", Message: fmt.Sprintf("argument %d: %v", i+1, err)}
		}
	}
	return nil
}

type queryHandler struct {
	fn      func(Args) (any, error)
	publish bool // takes no arguments: its value is published
}

// delivered is an update handed to the worker running the body.
type delivered struct {
	id   string
	name string
	args *structpb.ListValue
}

// bodyHandlers are the handlers one attempt of a body registered, the updates
// delivered to it and not applied yet, and what it published last.
type bodyHandlers struct {
	mu        sync.Mutex
	queries   map[string]queryHandler
	updates   map[string]func(Args) (any, error)
	delivered []delivered
	last      map[string]string
}

// Query registers the query handler name (1-200 printable characters) of the
// durable function s; it replaces one of the same name. Its value is published at
// the body's journal points (when it changed) and when the body ends, so that
// client.Query answers it while no worker runs the body.
//
//	var mu sync.Mutex
//	items := []string{}
//	step.Query("items", func() (any, error) {
//		mu.Lock()
//		defer mu.Unlock()
//		return slices.Clone(items), nil
//	})
//
// It runs on the worker's goroutine, beside the body: keep it quick and read-only,
// and guard what it shares with the body.
func (s *Step) Query(name string, fn func() (any, error)) error {
	if fn == nil {
		return fmt.Errorf("query handler %q: no function", name)
	}
	return s.register("query", name, func(h *bodyHandlers) {
		h.queries[name] = queryHandler{fn: func(args Args) (any, error) {
			if len(args) > 0 {
				return nil, &Failure{Type: "BadArguments", Message: fmt.Sprintf("query handler %q takes no arguments, got %d", name, len(args))}
			}
			return fn()
		}, publish: true}
	})
}

// QueryWithArgs registers a query handler that takes arguments, as Query does; its
// value is never published (client.Query answers it only while a worker runs the
// body).
func (s *Step) QueryWithArgs(name string, fn func(Args) (any, error)) error {
	if fn == nil {
		return fmt.Errorf("query handler %q: no function", name)
	}
	return s.register("query", name, func(h *bodyHandlers) { h.queries[name] = queryHandler{fn: fn} })
}

// Update registers the update handler name of the durable function s: it runs on the
// body's goroutine at the body's next journal point after the update arrived, and
// its result (any JSON-encodable value) or error is the caller's answer
// (client.Update), recorded in the journal. A replay runs it again with the recorded
// arguments at the same point (its result then is ignored): it must change the
// body's state only, not the world (call steps for that).
func (s *Step) Update(name string, fn func(Args) (any, error)) error {
	if fn == nil {
		return fmt.Errorf("update handler %q: no function", name)
	}
	return s.register("update", name, func(h *bodyHandlers) { h.updates[name] = fn })
}

func (s *Step) register(kind, name string, add func(*bodyHandlers)) error {
	if s == nil {
		return errOutside("registering a " + kind + " handler")
	}
	if err := checkName(kind+" handler's name", name, maxName); err != nil {
		return err
	}
	s.handlersOnce.Do(func() {
		s.handlers = &bodyHandlers{queries: map[string]queryHandler{}, updates: map[string]func(Args) (any, error){},
			last: map[string]string{}}
	})
	h := s.handlers
	h.mu.Lock()
	add(h)
	h.mu.Unlock()
	if s.inbox != nil {
		s.inbox.activate(s)
	}
	return nil
}

func argsOf(list *structpb.ListValue) (Args, error) {
	args := make(Args, 0, len(list.GetValues()))
	for _, v := range list.GetValues() {
		raw, err := protojson.Marshal(v)
		if err != nil {
			return nil, err
		}
		args = append(args, raw)
	}
	return args, nil
}

// runHandler calls a handler, turning a panic and a result that is not JSON into errors.
func runHandler(fn func(Args) (any, error), list *structpb.ListValue) (value *structpb.Value, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &Failure{Type: "panic", Message: fmt.Sprint(p)}
		}
	}()
	args, err := argsOf(list)
	if err != nil {
		return nil, err
	}
	out, err := fn(args)
	if err != nil {
		return nil, err
	}
	if value, err = toValue(out); err != nil {
		return nil, &Failure{Type: "ResultNotJson", Message: err.Error()}
	}
	return value, nil
}

// errorOf is a handler's error as an answer or a journal entry records it.
func errorOf(err error) (typ, message string) {
	rec := errorRecord(err)
	return rec.Type, rec.Message
}

func known[V any](m map[string]V) string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// answer is a query's answer: its value, or an error type and message.
func (h *bodyHandlers) answer(name string, args *structpb.ListValue) (*structpb.Value, string, string) {
	h.mu.Lock()
	handler, ok := h.queries[name]
	names := known(h.queries)
	h.mu.Unlock()
	if !ok {
		return nil, "UnknownQuery", fmt.Sprintf("the body has no query handler %q (it has: %s)", name, names)
	}
	value, err := runHandler(handler.fn, args)
	if err != nil {
		typ, message := errorOf(err)
		return nil, typ, message
	}
	return value, "", ""
}

// deliver hands an update to the body, for its next journal point (once).
func (h *bodyHandlers) deliver(u delivered) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.delivered {
		if d.id == u.id {
			return
		}
	}
	h.delivered = append(h.delivered, u)
}

func (h *bodyHandlers) take() []delivered {
	h.mu.Lock()
	defer h.mu.Unlock()
	taken := h.delivered
	h.delivered = nil
	return taken
}

func (h *bodyHandlers) takesUpdates() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.updates) > 0
}

// apply runs an update's handler: what the journal records of it.
func (h *bodyHandlers) apply(u delivered) *structpb.Value {
	h.mu.Lock()
	handler, ok := h.updates[u.name]
	names := known(h.updates)
	h.mu.Unlock()
	args := u.args
	if args == nil {
		args = &structpb.ListValue{}
	}
	fields := map[string]*structpb.Value{
		"update": structpb.NewStringValue(u.name),
		"args":   structpb.NewListValue(args),
	}
	failed := func(typ, message string) {
		fields["error"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"type": structpb.NewStringValue(typ), "message": structpb.NewStringValue(message),
		}})
	}
	if !ok {
		failed("UnknownUpdate", fmt.Sprintf("the body has no update handler %q (it has: %s)", u.name, names))
	} else if value, err := runHandler(handler, args); err != nil {
		failed(errorOf(err))
	} else {
		fields["result"] = value
	}
	return structpb.NewStructValue(&structpb.Struct{Fields: fields})
}

// reapply runs again, with the recorded arguments, an update a replay meets in the
// journal; one that failed or was refused changed nothing and is skipped.
func (s *Step) reapply(recorded *structpb.Value, stepID string) {
	fields := recorded.GetStructValue().GetFields()
	if fields == nil || fields["error"] != nil {
		return
	}
	name := fields["update"].GetStringValue()
	var handler func(Args) (any, error)
	if h := s.handlers; h != nil {
		h.mu.Lock()
		handler = h.updates[name]
		h.mu.Unlock()
	}
	if handler == nil {
		s.Logger().Warn("the journal applies an update the body has no handler for now", "step_id", stepID, "update", name)
		return
	}
	if _, err := runHandler(handler, fields["args"].GetListValue()); err != nil {
		s.Logger().Warn("an update handler failed when replayed", "step_id", stepID, "update", name, "error", err)
	}
}

// publish hands the worker the values of the queries without arguments that changed
// since the last publication, and says whether there were any.
func (s *Step) publish() bool {
	h := s.handlers
	if h == nil || s.inbox == nil {
		return false
	}
	h.mu.Lock()
	var names []string
	for name, q := range h.queries {
		if q.publish {
			names = append(names, name)
		}
	}
	h.mu.Unlock()
	slices.Sort(names)
	changed := map[string]*structpb.Value{}
	for _, name := range names {
		h.mu.Lock()
		q := h.queries[name]
		h.mu.Unlock()
		value, err := runHandler(q.fn, nil)
		if err != nil {
			continue // not publishable now: the last value stays
		}
		text, err := protojson.Marshal(value)
		if err != nil {
			continue
		}
		h.mu.Lock()
		if h.last[name] != string(text) {
			h.last[name] = string(text)
			changed[name] = value
		}
		h.mu.Unlock()
	}
	if len(changed) == 0 {
		return false
	}
	s.inbox.publish(s, changed)
	return true
}

// updatesPoint is a journal point of the body (a step call returned, a wait is
// reached): the updates the journal records next are applied again (a replay); past
// the journal's end, the updates delivered since the last point are applied and
// each recorded as an entry after the call's. Then the queries' values are published.
func (s *Step) updatesPoint(ctx context.Context) error {
	if s.stopped() != nil || ctx.Err() != nil {
		return nil
	}
	j := s.journal()
	h := s.handlers
	if !j.hasUpdates && h == nil {
		return nil
	}
	for j.hasUpdates {
		j.mu.Lock()
		seq := j.seq + 1
		entry := j.bySeq[seq]
		if entry == nil || entry.Function != updateFunction {
			j.mu.Unlock()
			break
		}
		j.seq = seq
		j.used[entry.StepId] = true
		j.mu.Unlock()
		s.reapply(entry.Output, entry.StepId)
	}
	if h == nil {
		return nil
	}
	j.mu.Lock()
	past := j.seq >= j.lastSeq
	j.mu.Unlock()
	if past {
		for _, u := range h.take() {
			if err := s.record(ctx, u); err != nil {
				return err
			}
		}
	}
	s.publish()
	return nil
}

// record applies an update delivered to the body and records it in the journal,
// unless it is recorded already.
func (s *Step) record(ctx context.Context, u delivered) error {
	id := updatePrefix + u.id
	j := s.journal()
	j.mu.Lock()
	if j.byID[id] != nil || j.used[id] {
		j.mu.Unlock()
		return nil
	}
	if err := j.take(id, updateFunction, s.limits); err != nil {
		j.mu.Unlock()
		return s.stop(err)
	}
	c := &stepCall{step: s, id: id, seq: j.seq, function: updateFunction}
	j.mu.Unlock()
	_, err := c.end(ctx, s.handlers.apply(u), nil)
	return err
}

// atPoint is a journal point after the step call c got its outcome (err nil).
func (c *stepCall) atPoint(ctx context.Context, err error) (*stepCall, error) {
	if err != nil {
		return c, err
	}
	if err := c.step.updatesPoint(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// endAtPoint records the call's outcome (end), then is a journal point.
func (c *stepCall) endAtPoint(ctx context.Context, value *structpb.Value, fnErr error) (*stepCall, error) {
	ended, err := c.end(ctx, value, fnErr)
	if err != nil {
		return nil, err
	}
	return ended.atPoint(ctx, nil)
}

// fetchUpdates asks the server for the updates sent to the body before it waits: the
// node gives up its lease with the wait, and they are applied at this point.
func (s *Step) fetchUpdates(ctx context.Context) {
	if s.handlers == nil || s.inbox == nil || !s.handlers.takesUpdates() {
		return
	}
	s.inbox.fetch(ctx, s)
}

// isOver says whether a recorded wait has its outcome.
func isOver(entry *cyclonev1.StepCall) bool {
	switch entry.GetStatus() {
	case cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, cyclonev1.StepCallStatus_STEP_CALL_STATUS_FAILED:
		return true
	}
	return false
}
