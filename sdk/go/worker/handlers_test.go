package worker

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

func cart(t *testing.T) (*Step, *[]string) {
	t.Helper()
	s := &Step{ClaimedStep: &cyclonev1.ClaimedStep{RunId: "r", Node: "n", Attempt: 2}}
	items := &[]string{}
	if err := s.Query("items", func() (any, error) { return *items, nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Update("add", func(args Args) (any, error) {
		var item string
		if err := args.Decode(&item); err != nil {
			return nil, err
		}
		if item == "" {
			return nil, &Failure{Type: "EmptyItem", Message: "no name"}
		}
		*items = append(*items, item)
		return len(*items), nil
	}); err != nil {
		t.Fatal(err)
	}
	return s, items
}

func list(t *testing.T, values ...any) *structpb.ListValue {
	t.Helper()
	l, err := structpb.NewList(values)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func jsonOf(t *testing.T, v *structpb.Value) string {
	t.Helper()
	raw, err := protojson.Marshal(v) // its spacing is not stable: encoding/json's is
	var decoded any
	if err == nil {
		err = json.Unmarshal(raw, &decoded)
	}
	if err == nil {
		raw, err = json.Marshal(decoded)
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func TestAnAppliedUpdateRecordsItsArgsAndResultOrError(t *testing.T) {
	s, items := cart(t)
	for _, c := range []struct {
		name string
		args *structpb.ListValue
		want string
	}{
		{"add", list(t, "tea"), `{"args":["tea"],"result":1,"update":"add"}`},
		{"add", list(t, ""), `{"args":[""],"error":{"message":"no name","type":"EmptyItem"},"update":"add"}`},
		{"add", list(t, "a", "b"), `{"args":["a","b"],"error":{"message":"takes 1 arguments, got 2","type":"BadArguments"},"update":"add"}`},
		{"remove", nil, `{"args":[],"error":{"message":"the body has no update handler \"remove\" (it has: add)","type":"UnknownUpdate"},"update":"remove"}`},
	} {
		if got := jsonOf(t, s.handlers.apply(delivered{id: "u", name: c.name, args: c.args})); got != c.want {
			t.Errorf("%s%v records %s, want %s", c.name, c.args, got, c.want)
		}
	}
	if len(*items) != 1 {
		t.Errorf("items %v", *items)
	}
	// A replay runs the handler again with the recorded args; a refused one, not.
	s.reapply(s.handlers.apply(delivered{id: "v", name: "add", args: list(t, "scone")}), "update:v")
	s.reapply(s.handlers.apply(delivered{id: "w", name: "add", args: list(t, "")}), "update:w")
	if strings.Join(*items, ",") != "tea,scone,scone" {
		t.Errorf("after the replays: %v", *items)
	}
}

func TestAQueryIsAnsweredByItsHandlerOrNamesTheHandlersThereAre(t *testing.T) {
	s, _ := cart(t)
	if value, typ, _ := s.handlers.answer("items", nil); typ != "" || jsonOf(t, value) != "[]" {
		t.Errorf("items: %v, %s", value, typ)
	}
	if _, typ, message := s.handlers.answer("items", list(t, 1)); typ != "BadArguments" {
		t.Errorf("items(1): %s %s", typ, message)
	}
	if _, typ, message := s.handlers.answer("total", nil); typ != "UnknownQuery" || !strings.Contains(message, "(it has: items)") {
		t.Errorf("total: %s %s", typ, message)
	}
	boom := errors.New("boom")
	if err := s.QueryWithArgs("fails", func(Args) (any, error) { return nil, boom }); err != nil {
		t.Fatal(err)
	}
	if _, typ, message := s.handlers.answer("fails", nil); typ == "" || message != "boom" {
		t.Errorf("fails: %s %s", typ, message)
	}
	if err := s.Query("", func() (any, error) { return nil, nil }); err == nil {
		t.Error("a query handler without a name was registered")
	}
}

func TestOnlyChangedValuesOfQueriesWithoutArgumentsArePublished(t *testing.T) {
	s, items := cart(t)
	s.inbox = newInbox(nil, nil)
	if err := s.QueryWithArgs("has", func(Args) (any, error) { return true, nil }); err != nil {
		t.Fatal(err)
	}
	s.inbox.bodies = map[nodeKey]*inboxBody{} // no poller: nothing is sent
	s.inbox.sending = true
	if !s.publish() || len(s.inbox.published) != 1 {
		t.Fatalf("first publication: %v", s.inbox.published)
	}
	p := s.inbox.published[[3]string{"r", "n", "items"}]
	if p.Attempt != 2 || jsonOf(t, p.Value) != "[]" {
		t.Errorf("published %v", p)
	}
	if s.publish() {
		t.Error("an unchanged value was published again")
	}
	*items = append(*items, "tea")
	if !s.publish() || jsonOf(t, s.inbox.published[[3]string{"r", "n", "items"}].Value) != `["tea"]` {
		t.Errorf("after a change: %v", s.inbox.published)
	}
}
