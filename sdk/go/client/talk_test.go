package client

import (
	"context"
	"testing"
	"time"
)

func TestTheServersWaitIsWhatIsLeftOfTheContextsDeadlineWithinItsBounds(t *testing.T) {
	if got := wait(context.Background(), maxQueryWait); got != nil {
		t.Errorf("without a deadline: %v, want the server's default (nil)", got)
	}
	far, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if got := wait(far, maxQueryWait).AsDuration(); got != maxQueryWait {
		t.Errorf("an hour left: %v, want %v", got, maxQueryWait)
	}
	near, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got := wait(near, maxUpdateWait).AsDuration(); got <= 0 || got > 5*time.Second {
		t.Errorf("5s left: %v", got)
	}
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if got := wait(past, maxUpdateWait).AsDuration(); got != time.Millisecond {
		t.Errorf("past the deadline: %v, want the least the server takes", got)
	}
}

func TestAChunkDecodesAsJSONOrAsAString(t *testing.T) {
	var text string
	if err := (Chunk{Text: "hé \"x\""}).Decode(&text); err != nil || text != "hé \"x\"" {
		t.Errorf("a text chunk: %q, %v", text, err)
	}
	var n struct{ N int }
	if err := (Chunk{JSON: []byte(`{"n":2}`)}).Decode(&n); err != nil || n.N != 2 {
		t.Errorf("a JSON chunk: %+v, %v", n, err)
	}
	if (Chunk{JSON: []byte("null")}).IsJSON() != true || (Chunk{Text: ""}).IsJSON() {
		t.Error("IsJSON")
	}
}

func TestArgumentsThatAreNotJSONAreRefusedBeforeAnythingIsSent(t *testing.T) {
	c := New(nil) // a call that reached the connection would panic
	if _, err := c.Query(context.Background(), "r", "n", "items", []any{1, func() {}}); err == nil {
		t.Error("Query sent a function")
	}
	if _, err := c.Update(context.Background(), "r", "n", "add", []any{make(chan int)}); err == nil {
		t.Error("Update sent a channel")
	}
}
