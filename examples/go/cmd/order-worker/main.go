// Command order-worker serves the "order.fulfil" action, a durable function in Go:
// its body calls four step functions, each call recorded in the node's journal, and
// replays them from the journal when the node runs again.
//
//   - price_order adds the shipping (safe to repeat, recorded after it returns);
//   - reserve_stock writes a reservation row in the worker's own transaction, which
//     records the call's success too (cyclone.step_call_record): it happens exactly
//     once;
//   - charge_card calls a payment gateway that takes no idempotency key, so it is
//     unsafe to repeat: it is recorded STARTED before it runs, and if the worker
//     dies during the call the next attempt does not charge again: the run is blocked
//     until an operator resolves the call (cyclone resolve RUN charge_card ...);
//   - send_receipt is safe to repeat (at least once).
//
// When the charge fails (declined, or resolved with --error), the body releases the
// reservation with another step call and completes with status "cancelled": a handled
// failure.
//
// Every step writes a row to the order_log table, so a test (or you) can count how
// many times each one really ran.
//
//	order-worker [-address HOST:PORT] [-database-url URL] [-limit CENTS] [-gateway-delay D]
//
// SIGINT or SIGTERM stops claiming and waits for the orders in flight; a second
// signal exits at once.
package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"cyclone/examples/go/worker"
)

// The reservations (one per order) and a log of every step function that ran.
const schema = `
CREATE TABLE IF NOT EXISTS reservations (
    run_id   uuid    NOT NULL PRIMARY KEY,
    order_id text    NOT NULL,
    released boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS order_log (
    run_id uuid        NOT NULL,
    call   text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT now()
)`

func main() {
	worker.Main("order-worker", schema, func(f worker.Flags, db *pgxpool.Pool) []worker.Action {
		o := &orders{db: db, limit: f.Limit, gatewayDelay: f.GatewayDelay}
		return []worker.Action{{Name: "order.fulfil", Handler: o.fulfil}}
	})
}

type orders struct {
	db           *pgxpool.Pool
	limit        int
	gatewayDelay time.Duration
}

// order is the run's input.
type order struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"` // cents
}

// shipping is added to every order, in cents.
const shipping = 490

type charge struct {
	ChargeID string `json:"charge_id"`
}

// fulfil is the durable function. It runs from the top at every attempt; the step
// calls that the journal already holds return their recorded outcome at once.
func (o *orders) fulfil(ctx context.Context, step *worker.Step) (any, error) {
	var in order
	if err := step.DecodeRunInput(&in); err != nil || in.OrderID == "" {
		return nil, &worker.Failure{Type: "BadInput", Message: fmt.Sprintf("want {order_id, amount}: %v", err), NonRetryable: true}
	}

	total, err := worker.Call(ctx, step, "price_order", func(ctx context.Context) (int, error) {
		return in.Amount + shipping, o.log(ctx, o.db, step, "price_order")
	})
	if err != nil {
		return nil, err
	}

	reservation, err := worker.CallInTx(ctx, step, o.db, "reserve_stock",
		func(ctx context.Context, tx pgx.Tx) (string, error) {
			if err := o.log(ctx, tx, step, "reserve_stock"); err != nil {
				return "", err
			}
			_, err := tx.Exec(ctx, `INSERT INTO reservations (run_id, order_id) VALUES ($1, $2)`, step.RunId, in.OrderID)
			return "r-" + in.OrderID, err
		})
	if err != nil {
		return nil, err
	}

	paid, err := worker.Call(ctx, step, "charge_card", func(ctx context.Context) (charge, error) {
		// The gateway takes the money at once; its answer may take a while.
		if err := o.log(ctx, o.db, step, "charge_card"); err != nil {
			return charge{}, err
		}
		if total > o.limit {
			return charge{}, &worker.Failure{Type: "CardDeclined",
				Message: fmt.Sprintf("%d cents is over the card's limit of %d", total, o.limit)}
		}
		if err := worker.Pause(ctx, o.gatewayDelay); err != nil {
			return charge{}, err
		}
		return charge{ChargeID: "ch_" + in.OrderID}, nil
	}, worker.UnsafeToRepeat())
	var declined *worker.Failure
	if errors.As(err, &declined) && !declined.NonRetryable {
		// The charge failed (now, or in an earlier attempt: the recorded failure is
		// returned again): give the stock back, durably, and end the order.
		if _, err := worker.Call(ctx, step, "release_stock", func(ctx context.Context) (bool, error) {
			if err := o.log(ctx, o.db, step, "release_stock"); err != nil {
				return false, err
			}
			_, err := o.db.Exec(ctx, `UPDATE reservations SET released = true WHERE run_id = $1`, step.RunId)
			return true, err
		}); err != nil {
			return nil, err
		}
		return map[string]any{"status": "cancelled", "reason": declined.Error()}, nil
	}
	if err != nil {
		return nil, err
	}

	if _, err := worker.Call(ctx, step, "send_receipt", func(ctx context.Context) (string, error) {
		return "sent", o.log(ctx, o.db, step, "send_receipt")
	}); err != nil {
		return nil, err
	}
	return map[string]any{"status": "fulfilled", "reservation": reservation, "charge_id": paid.ChargeID, "charged": total}, nil
}

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// log notes that a step function ran.
func (o *orders) log(ctx context.Context, db execer, step *worker.Step, call string) error {
	_, err := db.Exec(ctx, `INSERT INTO order_log (run_id, call) VALUES ($1, $2)`, step.RunId, call)
	return err
}
