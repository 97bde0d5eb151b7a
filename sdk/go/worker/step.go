package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// Step is one claimed step, as its handler sees it: the ClaimedStep of the protocol
// (RunId, Node, Attempt, LeaseToken, ...) and helpers to read its JSON payloads.
type Step struct {
	*cyclonev1.ClaimedStep

	// Set once CompleteInTx has committed: the outcome is recorded, nothing to report.
	completedInTx bool

	client      cyclonev1.WorkerServiceClient // for the step call RPCs
	cancel      context.CancelCauseFunc       // stops the handler (see stop)
	journalOnce sync.Once
	steps       *journal // the step calls of a durable function; see Call
	limits      Limits   // checked before anything is sent; zero fields: the defaults

	emits emitted // the chunks this attempt emitted, counted for their identities

	inbox        *inbox // the worker's queries and updates; nil outside a worker
	handlersOnce sync.Once
	handlers     *bodyHandlers // the query and update handlers the body registered; see Query

	log        *slog.Logger // the worker's, with the step's ids
	logs       stepLogs     // lines for the next heartbeat or the completion
	loggerOnce sync.Once
	logger     *slog.Logger
}

// Key is the step's idempotency key, "run_id:node": the same on every attempt, so an
// outside system can use it to drop a repeated effect.
func (s *Step) Key() string { return s.RunId + ":" + s.Node }

// RunDeadlineAt is the run's deadline (given to Submit, or its workflow's default) and
// true, or false when the run has none. At it the run is cancelled and the handler's
// context is cancelled with it; read it to budget the work.
func (s *Step) RunDeadlineAt() (time.Time, bool) {
	if s.GetRunDeadline() == nil {
		return time.Time{}, false
	}
	return s.GetRunDeadline().AsTime(), true
}

// DecodeInput decodes the node's static input into v (a pointer, as for json.Unmarshal).
func (s *Step) DecodeInput(v any) error { return decode(s.Input, v) }

// DecodeRunInput decodes the run's input into v.
func (s *Step) DecodeRunInput(v any) error { return decode(s.RunInput, v) }

// DecodeUpstream decodes the output of the upstream node named node into v.
func (s *Step) DecodeUpstream(node string, v any) error {
	out, ok := s.UpstreamOutputs[node]
	if !ok {
		return fmt.Errorf("no output of upstream node %q", node)
	}
	return decode(out, v)
}

// Failure is a handler error with a class name (Failure.type in the protocol) and
// whether retrying can help. Other errors are reported as retryable.
//
// A step call's failure comes back to the body as a *Failure too, read from what the
// journal recorded (on the first run as on every replay): Type, Message, Details and
// Module as recorded, and Err the error rebuilt from the record when this package
// knows its type (a *StepResultTooLarge), so errors.As finds it.
type Failure struct {
	Type    string
	Message string
	// Free text for people: for an error recorded by this package, the chain of
	// wrapped errors with their Go types.
	Details string
	// The Go package path of the error's type (StepCallError.module), when known.
	Module       string
	NonRetryable bool
	// The error this failure stands for, when it can be rebuilt; see Unwrap.
	Err error
}

func (f *Failure) Error() string { return f.Type + ": " + f.Message }

// Unwrap is the rebuilt error, for errors.As and errors.Is.
func (f *Failure) Unwrap() error { return f.Err }

// NonRetryable makes err a failure that discards the step at once: another attempt
// would fail the same way.
func NonRetryable(typ string, err error) error {
	return &Failure{Type: typ, Message: err.Error(), NonRetryable: true}
}

// Why a handler's context was cancelled before its deadline. The worker drops the
// outcome of such a step: the server would refuse it.
var (
	// ErrLeaseLost: Heartbeat answered ABORTED (the lease expired and the step may
	// already run elsewhere), or the completion SQL raised SQLSTATE CY001.
	ErrLeaseLost = errors.New("lease lost")
	// ErrRunCancelled: the run was cancelled (Heartbeat said so).
	ErrRunCancelled = errors.New("run cancelled")
)

// leaseLost is ErrLeaseLost with the server's explanation as its message.
type leaseLost struct{ reason string }

func (e *leaseLost) Error() string        { return e.reason }
func (e *leaseLost) Is(target error) bool { return target == ErrLeaseLost }

// toValue turns any JSON-encodable Go value into a google.protobuf.Value.
func toValue(v any) (*structpb.Value, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("output is not JSON: %w", err)
	}
	out := &structpb.Value{}
	if err := protojson.Unmarshal(raw, out); err != nil {
		return nil, err
	}
	return out, nil
}

func decode(in *structpb.Value, v any) error {
	if in == nil {
		in = structpb.NewNullValue()
	}
	raw, err := protojson.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, v)
}

// outputValue is a handler's output as the server takes it. One that cannot be
// encoded as JSON fails the node for good (OutputNotJson): the same code would return
// the same value at every attempt.
func outputValue(output any) (*structpb.Value, error) {
	value, err := toValue(output)
	if err != nil {
		return nil, fatal("OutputNotJson", "the handler's output (%T) cannot be sent: %v", output, err)
	}
	return value, nil
}
