package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// SQLSTATEs raised by the Cyclone SQL functions.
const (
	SQLStateLeaseLost   = "CY001" // the lease token no longer holds the step
	SQLStateUnknownStep = "CY002" // no such run or step
	// The step was already completed with this token: this transaction repeats a
	// completion that committed before, and must not commit its writes again.
	SQLStateAlreadyCompleted = "CY005"
)

// The completion transition, as the server's Complete RPC runs it. It checks the
// lease token and locks the run, then marks the step completed, releases the
// downstream steps and closes the run when nothing is left.
const stepCompleteSQL = `SELECT run_status FROM cyclone.step_complete($1, $2, $3, $4)`

// CompleteInTx records the step's success inside tx, the handler's own transaction on
// the Cyclone database, after its business writes: it calls cyclone.step_complete with
// the lease token and commits. The writes and the completion commit together or not
// at all, so the effect happens exactly once.
//
// When the lease was lost (the step expired and may run again elsewhere), the function
// raises SQLSTATE CY001: tx is rolled back, business writes included, and the error
// wraps ErrLeaseLost. The handler should return the error; the worker then drops the
// step without reporting anything. A repeat of a completion that already committed
// raises CY005 and is rolled back the same way; the step is done, so it returns nil.
//
// An output over the payload limit is not recorded: tx is rolled back and the error is
// a non-retryable OutputTooLarge failure, for the handler to return.
func (s *Step) CompleteInTx(ctx context.Context, tx pgx.Tx, output any) error {
	value, err := outputValue(output)
	if err == nil {
		err = outputTooLarge(value, s.limits)
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	raw, err := value.MarshalJSON()
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	var runStatus string
	err = tx.QueryRow(ctx, stepCompleteSQL, s.RunId, s.Node, s.LeaseToken, raw).Scan(&runStatus)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == SQLStateLeaseLost {
			return &leaseLost{reason: pgErr.Message}
		}
		if errors.As(err, &pgErr) && pgErr.Code == SQLStateAlreadyCompleted {
			s.completedInTx = true
			return nil
		}
		return fmt.Errorf("cyclone.step_complete: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit of the completion transaction: %w", err)
	}
	s.completedInTx = true
	return nil
}

// The success of a step call, recorded in the caller's transaction: it checks the
// lease token, records the output (or updates the STARTED entry of an unsafe call)
// and raises CY005 when the call already has an outcome.
const stepCallRecordSQL = `SELECT cyclone.step_call_record($1, $2, $3, $4, $5, $6, $7, $8)`

// TxStarter begins a transaction on the Cyclone database (a *pgxpool.Pool or a
// *pgx.Conn).
type TxStarter interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// CallInTx is Call for a step whose effect is a write to the Cyclone database: fn
// writes in tx, then the call's success is recorded in the same transaction
// (cyclone.step_call_record) and it commits. The write and the record commit
// together or not at all, so the effect happens exactly once. A failure of fn rolls
// tx back and is recorded with EndStepCall. Outside a durable function (s nil), fn
// runs in a transaction that commits when it succeeds.
func CallInTx[T any](ctx context.Context, s *Step, db TxStarter, name string, fn func(context.Context, pgx.Tx) (T, error), opts ...CallOption) (T, error) {
	var zero T
	var c *stepCall
	if s != nil {
		var err error
		if c, err = s.begin(ctx, name, fn, opts); err != nil || c.recorded != nil {
			return replayed[T](c.atPoint(ctx, err))
		}
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return zero, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // no-op once committed
	out, fnErr := fn(ctx, tx)
	if fnErr != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if s == nil || ctx.Err() != nil {
			return zero, fnErr
		}
		return replayed[T](c.endAtPoint(ctx, nil, fnErr))
	}
	if s == nil {
		return out, tx.Commit(ctx)
	}
	value, err := toValue(out)
	if err != nil {
		return zero, s.stop(fatal("StepCallError", "the return value of step call %s is not JSON: %v", c.id, err))
	}
	if tooLarge := c.tooLarge(value); tooLarge != nil {
		// Recorded as the call's failure, and its writes undone with the transaction.
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return replayed[T](c.endAtPoint(ctx, nil, tooLarge))
	}
	raw, err := value.MarshalJSON()
	if err != nil {
		return zero, err
	}
	var digest *string // NULL: no digest
	if c.digest != "" {
		digest = &c.digest
	}
	_, err = tx.Exec(ctx, stepCallRecordSQL, s.RunId, s.Node, s.LeaseToken, c.id, c.seq, c.function, raw, digest)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == SQLStateLeaseLost:
		return zero, s.stop(&leaseLost{reason: pgErr.Message})
	case errors.As(err, &pgErr) && pgErr.Code == SQLStateAlreadyCompleted:
		// The call got an outcome since the claim: ours rolls back with its write, and
		// the recorded one stands. A safe BeginStepCall (it writes nothing) reads it.
		_ = tx.Rollback(context.WithoutCancel(ctx))
		resp, err := retryUnavailable(ctx, func(ctx context.Context) (*cyclonev1.BeginStepCallResponse, error) {
			return s.client.BeginStepCall(ctx, c.beginRequest(false))
		})
		if err != nil {
			return zero, s.refused("BeginStepCall", c, err)
		}
		return replayed[T](c.remember(resp.Call).atPoint(ctx, nil))
	case err != nil:
		return zero, fmt.Errorf("cyclone.step_call_record: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return zero, fmt.Errorf("commit of step call %s: %w", c.id, err)
	}
	return replayed[T](c.remember(&cyclonev1.StepCall{
		StepId: c.id, Seq: c.seq, Function: c.function, UnsafeToRepeat: c.unsafe,
		Status: cyclonev1.StepCallStatus_STEP_CALL_STATUS_SUCCEEDED, Output: value, Attempt: s.Attempt,
		ArgsDigest: c.digest,
	}).atPoint(ctx, nil))
}
