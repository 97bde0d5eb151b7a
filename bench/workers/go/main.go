// Command bench-worker is the Go SDK's worker for the bench's languages scenario
// (bench/languages.py): it serves one action with a no-op handler through the SDK's
// Worker until SIGTERM, then exits 0.
//
//	bench-worker -address HOST:PORT -action NAME [-concurrency N]
//
// With CYCLONE_BENCH_STARTUP_DIR set, it writes the CPU seconds it spent starting
// (user and system) to a file named after its pid there, before its first claim.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/cyclone-workflows/cyclone/sdk/go/client"
	"github.com/cyclone-workflows/cyclone/sdk/go/worker"
)

func main() {
	address := flag.String("address", "", "the server, HOST:PORT")
	action := flag.String("action", "", "the action to serve")
	concurrency := flag.Int("concurrency", 64, "handler slots")
	flag.Parse()
	if err := run(*address, *action, *concurrency); err != nil {
		fmt.Fprintln(os.Stderr, "bench-worker:", err)
		os.Exit(1)
	}
}

func run(address, action string, concurrency int) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	conn, err := client.Dial(address)
	if err != nil {
		return err
	}
	defer conn.Close()
	noop := func(context.Context, *worker.Step) (any, error) { return nil, nil }
	w, err := worker.New(conn, worker.Options{
		Concurrency: concurrency,
		// Warnings only, as the Python worker logs by default: a line per step would
		// be much of what the worker does.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, worker.Action{Name: action, Handler: noop})
	if err != nil {
		return err
	}
	if dir := os.Getenv("CYCLONE_BENCH_STARTUP_DIR"); dir != "" {
		if err := writeStartupCPU(dir); err != nil {
			return err
		}
	}
	return w.Run(ctx)
}

// writeStartupCPU writes the process's CPU seconds so far (user and system) to
// dir/<pid>: the bench leaves them out of the CPU per step.
func writeStartupCPU(dir string) error {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return err
	}
	seconds := float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e9
	path := filepath.Join(dir, strconv.Itoa(os.Getpid()))
	return os.WriteFile(path, []byte(strconv.FormatFloat(seconds, 'g', -1, 64)), 0o644)
}
