// Command conformance-worker is the Go SDK's conformance worker: it serves the
// actions of tests/conformance/README.md (conformance.task, conformance.ledger and
// conformance.body) through the SDK's public API until SIGTERM, then exits 0.
//
//	conformance-worker -address HOST:PORT -database-url URL -effects FILE [-lease S] [-concurrency N]
//
// A planned crash appends its "crash" line to the effects file and ends the process
// at once with exit status 3.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cyclone-workflows/cyclone/sdk/go/client"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

// crashed is the exit status of a planned crash.
const crashed = 3

const ledgerSQL = `INSERT INTO conformance_ledger (run_id, node, entry, attempt) VALUES ($1, $2, $3, $4)`

func main() {
	address := flag.String("address", "", "the server, HOST:PORT")
	databaseURL := flag.String("database-url", "", "the server's database, for completion transactions")
	effectsPath := flag.String("effects", "", "the file effect lines are appended to")
	lease := flag.Float64("lease", 5, "the worker's lease, in seconds")
	concurrency := flag.Int("concurrency", 4, "handler slots")
	flag.Parse()
	if *address == "" || *databaseURL == "" || *effectsPath == "" {
		fmt.Fprintln(os.Stderr, "conformance-worker: -address, -database-url and -effects are required")
		os.Exit(2)
	}
	if err := run(*address, *databaseURL, *effectsPath, *lease, *concurrency); err != nil {
		fmt.Fprintln(os.Stderr, "conformance-worker:", err)
		os.Exit(1)
	}
}

func run(address, databaseURL, effectsPath string, lease float64, concurrency int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	db, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	conn, err := client.Dial(address)
	if err != nil {
		return err
	}
	defer conn.Close()
	c := &conformance{effects: &effects{path: effectsPath}, db: db}
	w, err := worker.New(conn, worker.Options{
		Concurrency: concurrency,
		Lease:       time.Duration(lease * float64(time.Second)),
		ClaimWait:   time.Second,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, nil)),
	},
		worker.Action{Name: "conformance.task", Handler: c.task},
		worker.Action{Name: "conformance.ledger", Handler: c.ledger},
		worker.Action{Name: "conformance.body", Handler: c.body},
	)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// effects is the effects file: a line per effect, on disk before the worker goes on.
type effects struct {
	path string
	mu   sync.Mutex
}

// write appends a line of phase for the step's attempt, and syncs it to disk.
func (e *effects) write(step *worker.Step, name, phase string) {
	line, err := json.Marshal(map[string]any{
		"run_id":  step.RunId,
		"node":    step.Node,
		"attempt": step.Attempt,
		"name":    name,
		"phase":   phase,
		"lang":    "go",
		"time":    float64(time.Now().UnixNano()) / 1e9,
	})
	if err != nil {
		panic(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out, err := os.OpenFile(e.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = out.Write(append(line, '\n'))
		if err == nil {
			err = out.Sync()
		}
		if closeErr := out.Close(); err == nil {
			err = closeErr
		}
	}
	if err != nil {
		// An effect that cannot be told would make the test's count wrong: stop here.
		fmt.Fprintln(os.Stderr, "conformance-worker: effects file:", err)
		os.Exit(1)
	}
}

// crashPlan is the part of a spec that plans a crash.
type crashPlan struct {
	Crash         string `json:"crash"`
	CrashAttempts []int  `json:"crash_attempts"`
}

// crashIf ends the process, as a kill would, when plan asks for point on this attempt.
func (e *effects) crashIf(step *worker.Step, plan crashPlan, point, name string) {
	if plan.Crash != point {
		return
	}
	attempts := plan.CrashAttempts
	if attempts == nil {
		attempts = []int{1}
	}
	if slices.Contains(attempts, int(step.Attempt)) {
		e.write(step, name, "crash")
		os.Exit(crashed)
	}
}

type conformance struct {
	effects *effects
	db      *pgxpool.Pool
}

// task is conformance.task, a DAG node.
func (c *conformance) task(_ context.Context, step *worker.Step) (any, error) {
	var spec struct {
		crashPlan
		Value        any  `json:"value"`
		FailAttempts int  `json:"fail_attempts"`
		Unencodable  bool `json:"unencodable_output"`
		BigOutput    *int `json:"big_output"`
	}
	if err := step.DecodeInput(&spec); err != nil {
		return nil, worker.NonRetryable("BadInput", err)
	}
	c.effects.write(step, step.Node, "effect")
	c.effects.crashIf(step, spec.crashPlan, "after_effect", step.Node)
	if int(step.Attempt) <= spec.FailAttempts {
		return nil, &worker.Failure{Type: "PlannedFailure", Message: fmt.Sprintf("planned failure %d", step.Attempt)}
	}
	if spec.Unencodable {
		return map[string]any{"tags": make(chan string)}, nil // a channel: JSON has none
	}
	if spec.BigOutput != nil {
		return map[string]any{"text": strings.Repeat("x", *spec.BigOutput)}, nil
	}
	upstream := make([]string, 0, len(step.UpstreamOutputs))
	for name := range step.UpstreamOutputs {
		upstream = append(upstream, name)
	}
	slices.Sort(upstream)
	return map[string]any{"value": spec.Value, "attempt": step.Attempt, "upstream": upstream}, nil
}

// ledger is conformance.ledger: a completion transaction.
func (c *conformance) ledger(ctx context.Context, step *worker.Step) (any, error) {
	var spec struct {
		crashPlan
		Entry        string  `json:"entry"`
		HoldAttempts []int   `json:"hold_attempts"`
		HoldSeconds  float64 `json:"hold_seconds"`
	}
	spec.HoldSeconds = 1
	if err := step.DecodeInput(&spec); err != nil {
		return nil, worker.NonRetryable("BadInput", err)
	}
	if slices.Contains(spec.HoldAttempts, int(step.Attempt)) {
		c.effects.write(step, spec.Entry, "holding")
		// Whatever happens to the lease meanwhile: the point is to come back late.
		time.Sleep(time.Duration(spec.HoldSeconds * float64(time.Second)))
		c.effects.write(step, spec.Entry, "held")
	}
	// The transaction goes on when the lease is lost, so that the server is the one
	// to refuse the completion (and the insert with it).
	ctx = context.WithoutCancel(ctx)
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) // no-op once committed
	if _, err := tx.Exec(ctx, ledgerSQL, step.RunId, step.Node, spec.Entry, step.Attempt); err != nil {
		return nil, err
	}
	c.effects.write(step, spec.Entry, "effect")
	c.effects.crashIf(step, spec.crashPlan, "before_commit", spec.Entry)
	output := map[string]any{"entry": spec.Entry, "attempt": step.Attempt}
	if err := step.CompleteInTx(ctx, tx, output); err != nil {
		return nil, err
	}
	c.effects.crashIf(step, spec.crashPlan, "after_commit", spec.Entry)
	return output, nil
}

// operation is one entry of a body's calls.
type operation struct {
	crashPlan
	Step    *string         `json:"step"`
	Result  any             `json:"result"`
	Unsafe  bool            `json:"unsafe"`
	Sleep   *float64        `json:"sleep"`
	Event   *string         `json:"event"`
	Timeout float64         `json:"timeout"`
	Child   json.RawMessage `json:"child"`
}

// bodySpec is a body's input: its node's input, or for a child its run's input.
type bodySpec struct {
	Calls []operation `json:"calls"`
}

// body is conformance.body, a durable function.
func (c *conformance) body(ctx context.Context, step *worker.Step) (any, error) {
	var spec bodySpec
	err := step.DecodeInput(&spec)
	if err == nil && spec.Calls == nil {
		err = step.DecodeRunInput(&spec)
	}
	if err != nil {
		return nil, worker.NonRetryable("BadInput", err)
	}
	results := make([]any, 0, len(spec.Calls))
	for _, op := range spec.Calls {
		result, err := c.call(ctx, step, op)
		if err != nil {
			return nil, err
		}
		results = append(results, result)
	}
	return map[string]any{"results": results}, nil
}

// call runs one operation of a body and returns its result.
func (c *conformance) call(ctx context.Context, step *worker.Step, op operation) (any, error) {
	switch {
	case op.Step != nil:
		id := *op.Step
		// The step's only argument is its id, digested as every language digests it.
		name, opts := "conformance.effect", []worker.CallOption{worker.WithStepID(id), worker.WithArgs(id)}
		if op.Unsafe {
			name, opts = "conformance.unsafe_effect", append(opts, worker.UnsafeToRepeat())
		}
		result, err := worker.Call(ctx, step, name, func(context.Context) (any, error) {
			c.effects.crashIf(step, op.crashPlan, "before_effect", id)
			c.effects.write(step, id, "effect")
			c.effects.crashIf(step, op.crashPlan, "after_effect", id)
			return op.Result, nil
		}, opts...)
		if err != nil {
			return nil, err
		}
		c.effects.crashIf(step, op.crashPlan, "after_call", id)
		return result, nil
	case op.Sleep != nil:
		return nil, step.Sleep(ctx, time.Duration(*op.Sleep*float64(time.Second)))
	case op.Event != nil:
		c.effects.write(step, *op.Event, "waiting")
		return worker.WaitForEvent[any](ctx, step, *op.Event, time.Duration(op.Timeout*float64(time.Second)))
	case op.Child != nil:
		wf := client.NewWorkflow("conformance.body").Node("conformance.body", "conformance.body")
		child, err := step.StartChild(ctx, wf, map[string]any{"calls": op.Child})
		if err != nil {
			return nil, err
		}
		outcome, err := child.Result(ctx)
		if err != nil {
			return nil, err
		}
		return childOutput(outcome)
	}
	return nil, worker.NonRetryable("BadInput", errors.New("unknown operation"))
}

// childOutput is what a body gets of a finished child, as the Python SDK gives it:
// the output of its only node, else {node: output} of its nodes.
func childOutput(outcome worker.ChildOutcome) (any, error) {
	raw, err := json.Marshal(outcome.Outputs)
	if len(outcome.Outputs) == 1 {
		for _, only := range outcome.Outputs {
			raw = only
		}
	}
	var out any
	if err == nil {
		err = json.Unmarshal(raw, &out)
	}
	return out, err
}
