package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
func (s *Step) CompleteInTx(ctx context.Context, tx pgx.Tx, output any) error {
	raw, err := json.Marshal(output)
	if err != nil {
		return fmt.Errorf("output is not JSON: %w", err)
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
