// Package example is what the example commands share: their flags and defaults, the
// database of their effects and the connection to the server.
package example

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

	"github.com/cyclone-workflows/cyclone/sdk/go/client"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

// Env is the environment variable name, or fallback when it is unset or empty.
func Env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// EmbeddedDatabaseURL is the database of `make run`'s embedded Postgres, which
// listens on a unix socket in .cyclone/pgdata at the repository root: the nearest such
// folder above the current directory. Empty when there is none.
func EmbeddedDatabaseURL() string {
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

// Pause waits d, or until ctx ends: then it returns why (context.Cause).
func Pause(ctx context.Context, d time.Duration) error {
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

// Flags are the command line that the example commands share.
type Flags struct {
	Address      string
	DatabaseURL  string
	Limit        int           // the largest charge the card accepts, in cents
	GatewayDelay time.Duration // how long the fake payment gateway takes to answer
	Concurrency  int
	Lease        time.Duration
	// The server's --max-payload-bytes: outputs and step results are checked against it.
	MaxPayloadBytes int
}

func parseFlags() Flags {
	var f Flags
	flag.StringVar(&f.Address, "address", Env("CYCLONE_ADDRESS", "127.0.0.1:50051"), "the Cyclone server")
	flag.StringVar(&f.DatabaseURL, "database-url", Env("CYCLONE_DATABASE_URL", EmbeddedDatabaseURL()),
		"the Cyclone database (default: $CYCLONE_DATABASE_URL, else the one that make run embeds)")
	flag.IntVar(&f.Limit, "limit", 100_000, "largest charge the card accepts, in cents; larger ones are declined")
	flag.DurationVar(&f.GatewayDelay, "gateway-delay", 0,
		"how long the payment gateway takes to answer (for demos: kill the worker meanwhile)")
	flag.IntVar(&f.Concurrency, "concurrency", 4, "handlers running at once")
	flag.DurationVar(&f.Lease, "lease", 30*time.Second, "lease asked for each step; heartbeats every third")
	flag.IntVar(&f.MaxPayloadBytes, "max-payload-bytes", worker.DefaultMaxPayloadBytes,
		"the server's payload limit (its --max-payload-bytes): larger outputs and step results fail")
	flag.Parse()
	return f
}

// Main is the main function of an example command. It parses the flags, opens the
// Cyclone database and runs schema there (the tables of the handlers' effects, which
// commit with the completions), connects to the server, then runs a worker of the
// actions that actions returns until SIGINT or SIGTERM; then it waits for the
// handlers in flight, and a second signal ends the process at once. It exits 1 when
// the worker cannot start or fails.
func Main(name, schema string, actions func(f Flags, db *pgxpool.Pool) []worker.Action) {
	f := parseFlags()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := serve(f, schema, worker.Options{Concurrency: f.Concurrency, Lease: f.Lease, Logger: log,
		Limits: worker.Limits{MaxPayloadBytes: f.MaxPayloadBytes}}, actions); err != nil {
		log.Error(name+" failed", "error", err)
		os.Exit(1)
	}
}

func serve(f Flags, schema string, opts worker.Options, actions func(f Flags, db *pgxpool.Pool) []worker.Action) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if f.DatabaseURL == "" {
		return errors.New("no database: pass -database-url or set $CYCLONE_DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, f.DatabaseURL)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("creating the tables: %w", err)
	}
	conn, err := client.Dial(f.Address)
	if err != nil {
		return fmt.Errorf("server %s: %w", f.Address, err)
	}
	defer conn.Close()

	w, err := worker.New(conn, opts, actions(f, pool)...)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		stop() // a second signal now ends the process
	}()
	return w.Run(ctx)
}
