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
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"cyclone/examples/go/worker"
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
	address := flag.String("address", env("CYCLONE_ADDRESS", "127.0.0.1:50051"), "the Cyclone server")
	databaseURL := flag.String("database-url", env("CYCLONE_DATABASE_URL", embeddedURL()),
		"the Cyclone database (default: $CYCLONE_DATABASE_URL, else the one `make run` embeds)")
	limit := flag.Int("limit", 100_000, "largest charge the card accepts, in cents; larger ones are declined")
	gatewayDelay := flag.Duration("gateway-delay", 0, "how long the payment gateway takes to answer (for demos)")
	concurrency := flag.Int("concurrency", 4, "charges running at once")
	lease := flag.Duration("lease", 30*time.Second, "lease asked for each step; heartbeats every third")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*address, *databaseURL, &checkout{limit: *limit, gatewayDelay: *gatewayDelay},
		worker.Options{Concurrency: *concurrency, Lease: *lease, Logger: log}); err != nil {
		log.Error("checkout-worker failed", "error", err)
		os.Exit(1)
	}
}

func run(address, databaseURL string, c *checkout, opts worker.Options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if databaseURL == "" {
		return errors.New("no database: pass -database-url or set $CYCLONE_DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, ledgerSchema); err != nil {
		return fmt.Errorf("creating the ledger: %w", err)
	}
	c.db = pool

	// Reconnect within seconds when the server restarts (gRPC's default backoff grows
	// to two minutes).
	conn, err := grpc.NewClient(address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: 5 * time.Second},
		}))
	if err != nil {
		return fmt.Errorf("server %s: %w", address, err)
	}
	defer conn.Close()

	w := worker.New(conn, opts, worker.Action{Name: "checkout.charge", Handler: c.charge})
	go func() {
		<-ctx.Done()
		stop() // a second signal now ends the process
	}()
	return w.Run(ctx)
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
	if err := waitForGateway(ctx, c.gatewayDelay); err != nil {
		return nil, err
	}
	// Completes the step in tx and commits; the worker then reports nothing.
	return nil, step.CompleteInTx(ctx, tx, map[string]any{
		"charged":  p.Amount,
		"currency": p.Currency,
		"booked":   tag.RowsAffected() == 1,
	})
}

func waitForGateway(ctx context.Context, d time.Duration) error {
	if d == 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// embeddedURL is the database of `make run`'s embedded Postgres, which listens on a
// unix socket in .cyclone/pgdata at the repository root: the nearest such folder above
// the current directory. Empty when there is none.
func embeddedURL() string {
	dir, err := os.Getwd()
	for err == nil {
		socketDir := filepath.Join(dir, ".cyclone", "pgdata")
		if _, statErr := os.Stat(socketDir); statErr == nil {
			return "postgresql://postgres:@/cyclone?host=" + socketDir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return ""
}
