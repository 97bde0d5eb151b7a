package worker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// The server keeps 1000 lines per attempt and marks the cut with one more: lines past
// that are not collected.
const maxLogLines = 1001

// stepLogs collects the lines a handler logs through Step.Logger, for the next
// heartbeat or the completion to carry to the server.
type stepLogs struct {
	mu      sync.Mutex
	pending []*cyclonev1.LogLine
	total   int
}

func (l *stepLogs) add(line *cyclonev1.LogLine) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= maxLogLines {
		return
	}
	l.total++
	l.pending = append(l.pending, line)
}

// take hands out the lines collected since the last take.
func (l *stepLogs) take() []*cyclonev1.LogLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := l.pending
	l.pending = nil
	return lines
}

// giveBack puts lines whose heartbeat failed in front of the newer ones: the next
// heartbeat carries them again.
func (l *stepLogs) giveBack(lines []*cyclonev1.LogLine) {
	if len(lines) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(lines, l.pending...)
}

// Logger is a logger whose lines travel with the step: the server stores them under
// this attempt (cyclone logs RUN NODE, GetRun with logs), with the heartbeats and the
// completion. They also go to the worker's own logger, with the step's ids.
func (s *Step) Logger() *slog.Logger {
	s.loggerOnce.Do(func() {
		base := s.log
		if base == nil {
			base = slog.New(slog.DiscardHandler)
		}
		s.logger = slog.New(&stepHandler{next: base.Handler(), logs: &s.logs})
	})
	return s.logger
}

// stepHandler keeps each record as a LogLine, its attributes as key=value after the
// message, and passes it on to the worker's handler.
type stepHandler struct {
	next   slog.Handler
	logs   *stepLogs
	attrs  []slog.Attr
	groups []string
	name   string
}

func (h *stepHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= slog.LevelInfo || h.next.Enabled(ctx, level)
}

func (h *stepHandler) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	name := h.name
	prefix := strings.Join(append(append([]string(nil), h.groups...), ""), ".")
	write := func(a slog.Attr, top bool) {
		if top && a.Key == "logger" { // names the logger, as in Python
			name = a.Value.String()
			return
		}
		fmt.Fprintf(&b, " %s%s=%v", prefix, a.Key, a.Value)
	}
	for _, a := range h.attrs {
		write(a, false)
	}
	r.Attrs(func(a slog.Attr) bool { write(a, len(h.groups) == 0); return true })
	at := r.Time
	if at.IsZero() {
		at = time.Now()
	}
	h.logs.add(&cyclonev1.LogLine{At: timestamppb.New(at), Level: levelName(r.Level), Message: b.String(), Logger: name})
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *stepHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(attrs)
	for _, a := range attrs {
		if a.Key == "logger" && len(h.groups) == 0 {
			c.name = a.Value.String()
		} else {
			c.attrs = append(append([]slog.Attr(nil), c.attrs...), a)
		}
	}
	return &c
}

func (h *stepHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.next = h.next.WithGroup(name)
	c.groups = append(append([]string(nil), h.groups...), name)
	return &c
}

// levelName is the level as the server's lines name it (Python's names).
func levelName(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "ERROR"
	case l >= slog.LevelWarn:
		return "WARNING"
	case l >= slog.LevelInfo:
		return "INFO"
	default:
		return "DEBUG"
	}
}
