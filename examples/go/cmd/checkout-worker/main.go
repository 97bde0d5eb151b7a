// Command checkout-worker serves the "checkout.charge" action of the checkout
// workflow: it charges the amount that the upstream "price" node computed, and
// records the charge as a ledger row that commits in the same Postgres transaction as
// the step's completion, so a charge is booked exactly once whatever crashes or
// retries happen.
//
//	checkout-worker [-address HOST:PORT] [-database-url URL] [-limit CENTS]
//
// SIGINT or SIGTERM stops claiming and waits for the charges in flight; a second
// signal exits at once.
package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cyclone-workflows/cyclone/sdk/go/worker"

	"cyclone/examples/go/internal/example"
)

// The ledger, as examples/python creates it too: one row per (run_id, node).
const ledgerSchema = `
CREATE TABLE IF NOT EXISTS ledger (
    run_id uuid    NOT NULL,
    node   text    NOT NULL,
    amount integer NOT NULL,
    PRIMARY KEY (run_id, node)
)`

func main() {
	example.Main("checkout-worker", ledgerSchema, func(f example.Flags, db *pgxpool.Pool) []worker.Action {
		c := &checkout{db: db, limit: f.Limit, gatewayDelay: f.GatewayDelay}
		return []worker.Action{{Name: "checkout.charge", Handler: c.charge}}
	})
}

type checkout struct {
	db           *pgxpool.Pool
	limit        int
	gatewayDelay time.Duration
}

// price is the output of the upstream "price" node.
type price struct {
	Amount   int    `json:"amount"` // cents
	Currency string `json:"currency"`
}

// charge books the priced amount. The ledger row and the completion commit in one
// transaction: if the lease is lost before the commit (the step may already run
// elsewhere), cyclone.step_complete raises CY001 and the row is rolled back with it.
func (c *checkout) charge(ctx context.Context, step *worker.Step) (any, error) {
	var p price
	if err := step.DecodeUpstream("price", &p); err != nil {
		return nil, worker.NonRetryable("BadInput", err)
	}
	if p.Amount > c.limit {
		return nil, &worker.Failure{
			Type:         "CardDeclined",
			Message:      fmt.Sprintf("%d cents is over the card's limit of %d", p.Amount, c.limit),
			NonRetryable: true,
		}
	}

	tx, err := c.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // no-op once committed

	// The idempotency key (run_id, node) is the ledger's primary key: even a write
	// that escaped the transaction could not book the charge twice.
	tag, err := tx.Exec(ctx,
		`INSERT INTO ledger (run_id, node, amount) VALUES ($1, $2, $3)
		 ON CONFLICT (run_id, node) DO NOTHING`,
		step.RunId, step.Node, p.Amount)
	if err != nil {
		return nil, err
	}
	if err := example.Pause(ctx, c.gatewayDelay); err != nil {
		return nil, err
	}
	// Completes the step in tx and commits; the worker then reports nothing.
	return nil, step.CompleteInTx(ctx, tx, map[string]any{
		"charged":  p.Amount,
		"currency": p.Currency,
		"booked":   tag.RowsAffected() == 1,
	})
}
