package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// What the example commands share: their defaults and the connection to the server.

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

// Dial makes a plaintext connection to a Cyclone server that reconnects within
// seconds when the server restarts (gRPC's default backoff grows to two minutes).
func Dial(address string) (*grpc.ClientConn, error) {
	return grpc.NewClient(address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: 5 * time.Second},
		}))
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

// Serve is the main loop of a worker command. It opens the Cyclone database at
// databaseURL and runs schema there (the tables of its effects, which commit with
// the completions), connects to the server at address, then runs a worker of the
// actions that actions returns until SIGINT or SIGTERM; then it waits for the
// handlers in flight, and a second signal ends the process at once.
func Serve(address, databaseURL, schema string, opts Options, actions func(db *pgxpool.Pool) []Action) error {
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
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("creating the tables: %w", err)
	}
	conn, err := Dial(address)
	if err != nil {
		return fmt.Errorf("server %s: %w", address, err)
	}
	defer conn.Close()

	w := New(conn, opts, actions(pool)...)
	go func() {
		<-ctx.Done()
		stop() // a second signal now ends the process
	}()
	return w.Run(ctx)
}
