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
// An order that asks for an invoice ("invoice_lines": n in the run's input) has it
// rendered by render_invoice before the charge. A large one is over the payload limit
// of a step result: the call fails with worker.StepResultTooLarge, recorded as its
// failure, and the body stores the invoice in the invoices table instead
// (store_invoice) and keeps a reference to it.
//
// With -free-shipping the worker runs the next version of the body: shipping is
// waived (waive_shipping) behind the patch marker "free-shipping", so that a run that
// went past pricing on the code before keeps its price when it replays on this one.
//
// Every step writes a row to the order_log table, so a test (or you) can count how
// many times each one really ran.
//
//	order-worker [-address HOST:PORT] [-database-url URL] [-limit CENTS] [-gateway-delay D] [-free-shipping]
//
// SIGINT or SIGTERM stops claiming and waits for the orders in flight; a second
// signal exits at once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cyclone-workflows/cyclone/sdk/go/worker"

	"cyclone/examples/go/internal/example"
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
);
CREATE TABLE IF NOT EXISTS invoices (
    run_id uuid NOT NULL PRIMARY KEY,
    body   text NOT NULL
)`

func main() {
	freeShipping := flag.Bool("free-shipping", false,
		"run the next version of the body: shipping is free (behind the patch marker \"free-shipping\")")
	example.Main("order-worker", schema, func(f example.Flags, db *pgxpool.Pool) []worker.Action {
		o := &orders{db: db, limit: f.Limit, gatewayDelay: f.GatewayDelay, freeShipping: *freeShipping}
		return []worker.Action{{Name: "order.fulfil", Handler: o.fulfil}}
	})
}

type orders struct {
	db           *pgxpool.Pool
	limit        int
	gatewayDelay time.Duration
	freeShipping bool
}

// order is the run's input.
type order struct {
	OrderID      string `json:"order_id"`
	Amount       int    `json:"amount"`        // cents
	InvoiceLines int    `json:"invoice_lines"` // 0: no invoice
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
	if o.freeShipping {
		// The change this version brings. A run that went past this point on the code
		// before has no marker here: it takes the old path, and replays.
		free, err := step.Patched(ctx, "free-shipping")
		if err != nil {
			return nil, err
		}
		if free {
			if total, err = worker.Call(ctx, step, "waive_shipping", func(ctx context.Context) (int, error) {
				return total - shipping, o.log(ctx, o.db, step, "waive_shipping")
			}); err != nil {
				return nil, err
			}
		}
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

	var invoice string
	if in.InvoiceLines > 0 {
		if invoice, err = o.invoice(ctx, step, in, total); err != nil {
			return nil, err
		}
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
		if err := example.Pause(ctx, o.gatewayDelay); err != nil {
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
	done := map[string]any{"status": "fulfilled", "reservation": reservation, "charge_id": paid.ChargeID, "charged": total}
	if invoice != "" {
		done["invoice"] = invoice
	}
	return done, nil
}

// invoice renders the order's invoice with a step call, and returns it; when it is
// too large for the journal, it stores it with another and returns its reference.
func (o *orders) invoice(ctx context.Context, step *worker.Step, in order, total int) (string, error) {
	text, err := worker.Call(ctx, step, "render_invoice", func(ctx context.Context) (string, error) {
		return renderInvoice(in, total), o.log(ctx, o.db, step, "render_invoice")
	})
	var tooLarge *worker.StepResultTooLarge
	if !errors.As(err, &tooLarge) {
		return text, err
	}
	// Recorded as the call's failure: a replay gets the same error and comes here too.
	return worker.CallInTx(ctx, step, o.db, "store_invoice", func(ctx context.Context, tx pgx.Tx) (string, error) {
		if err := o.log(ctx, tx, step, "store_invoice"); err != nil {
			return "", err
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (run_id, body) VALUES ($1, $2)`, step.RunId, renderInvoice(in, total))
		return "invoices/" + step.RunId, err
	})
}

// renderInvoice is the invoice's text: one line per item, then the total.
func renderInvoice(in order, total int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Invoice for order %s\n", in.OrderID)
	for i := range in.InvoiceLines {
		fmt.Fprintf(&b, "%6d  item of order %s  %10d cents\n", i+1, in.OrderID, in.Amount/in.InvoiceLines)
	}
	fmt.Fprintf(&b, "Total (shipping included): %d cents\n", total)
	return b.String()
}

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// log notes that a step function ran.
func (o *orders) log(ctx context.Context, db execer, step *worker.Step, call string) error {
	_, err := db.Exec(ctx, `INSERT INTO order_log (run_id, call) VALUES ($1, $2)`, step.RunId, call)
	return err
}
