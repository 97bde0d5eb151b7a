package worker

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
)

// What the server takes, checked before anything is sent: a value the server would
// refuse becomes an error where the body or the node's failure shows it, instead of a
// refused request whose cause nobody sees.
const (
	// DefaultMaxPayloadBytes is the server's default payload limit
	// (--max-payload-bytes): the largest step call result or handler output, in
	// bytes of its protobuf Value.
	DefaultMaxPayloadBytes = 1 << 20
	// MaxStepCalls is the most step calls (steps and patch markers) a node's journal
	// holds.
	MaxStepCalls = 10_000

	maxName      = 200       // step ids, functions, error types and modules, in characters
	maxErrorText = 60 * 1024 // error messages and details (the server takes 64 KiB)
	// What a step id may add to a step name: "#" and the occurrence.
	occurrenceRoom = 7
)

// Limits are the limits a worker checks its results against: the server's payload
// limit and the size of a durable function's journal. Zero fields take the defaults.
type Limits struct {
	MaxPayloadBytes int // default DefaultMaxPayloadBytes; set it to --max-payload-bytes
	MaxStepCalls    int // default MaxStepCalls; a lower one may be set, not a higher one
}

func (l Limits) payload() int {
	if l.MaxPayloadBytes > 0 {
		return l.MaxPayloadBytes
	}
	return DefaultMaxPayloadBytes
}

func (l Limits) stepCalls() int {
	if l.MaxStepCalls > 0 {
		return min(l.MaxStepCalls, MaxStepCalls)
	}
	return MaxStepCalls
}

// StepResultTooLarge is the failure of a step call whose result is larger than the
// server's payload limit. The call is recorded failed with it, so the body gets it
// (inside a *Failure: use errors.As) on its first run and on every replay, and may
// handle it: store the value elsewhere and go on with a reference. A body that
// returns it fails its node for good: the same code returns the same size.
type StepResultTooLarge struct {
	StepID   string `json:"step_id"`
	Function string `json:"function"`
	Size     int    `json:"size"`  // bytes of the result's protobuf Value
	Limit    int    `json:"limit"` // the payload limit
}

func (e *StepResultTooLarge) Error() string {
	return fmt.Sprintf("step %q (%s) returned %d bytes; the limit of a step result is %d bytes. "+
		"Keep a large value outside the journal: store it elsewhere (a bucket, a table) and "+
		"return a reference to it", e.StepID, e.Function, e.Size, e.Limit)
}

// thisPackage is the Go package path of this package: the module of the errors it
// records.
var thisPackage = reflect.TypeFor[StepResultTooLarge]().PkgPath()

// outputTooLarge is the failure of a handler whose output is over the payload limit,
// or nil.
func outputTooLarge(value *structpb.Value, limits Limits) error {
	if size := proto.Size(value); size > limits.payload() {
		return &Failure{Type: "OutputTooLarge", Module: thisPackage, NonRetryable: true, Message: fmt.Sprintf(
			"the handler returned %d bytes; the limit of an output is %d bytes. Keep a large "+
				"value outside: store it elsewhere (a bucket, a table) and return a reference to it",
			size, limits.payload())}
	}
	return nil
}

// errorRecord is what the journal records of a step call's error: the Go type's
// name and package (a *Failure's own Type and Module), its message, the chain of
// wrapped errors as details, and for the errors this package can rebuild, their
// fields as attributes.
func errorRecord(err error) *cyclonev1.StepCallError {
	typ, module := typeName(err)
	message, detail := err.Error(), details(err)
	var f *Failure
	if errors.As(err, &f) {
		typ, module = f.Type, f.Module
		if error(f) == err {
			message = f.Message
		}
		if f.Details != "" {
			detail = f.Details
		}
	}
	rec := &cyclonev1.StepCallError{
		Type:    clip(typ, maxName),
		Message: clip(message, maxErrorText),
		Details: clip(detail, maxErrorText),
	}
	if len(module) <= maxName {
		rec.Module = clip(module, maxName)
	}
	var tooLarge *StepResultTooLarge
	if errors.As(err, &tooLarge) {
		rec.Attributes, _ = structpb.NewValue(map[string]any{
			"step_id": tooLarge.StepID, "function": tooLarge.Function,
			"size": tooLarge.Size, "limit": tooLarge.Limit,
		})
	}
	return rec
}

// recordedFailure is what the body gets for a recorded failure: the record, with the
// error rebuilt when it is one of this package's.
func recordedFailure(rec *cyclonev1.StepCallError) *Failure {
	f := &Failure{Type: rec.GetType(), Message: rec.GetMessage(), Details: rec.GetDetails(), Module: rec.GetModule()}
	if f.Module == thisPackage && f.Type == "StepResultTooLarge" {
		var e StepResultTooLarge
		if decode(rec.GetAttributes(), &e) == nil {
			f.Err, f.NonRetryable = &e, true
		}
	}
	return f
}

// typeName is the name and package path of err's dynamic type ("PathError",
// "io/fs"), the pointer taken off. The wrappers of fmt.Errorf and errors.Join name
// nothing: the error they wrap (the first) does.
func typeName(err error) (string, string) {
	t := reflect.TypeOf(err)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if pkg := t.PkgPath(); pkg == "fmt" || pkg == "errors" {
		var inner error
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			inner = u.Unwrap()
		case interface{ Unwrap() []error }:
			if errs := u.Unwrap(); len(errs) > 0 {
				inner = errs[0]
			}
		}
		if inner != nil {
			return typeName(inner)
		}
	}
	if t.Name() == "" {
		return t.String(), t.PkgPath()
	}
	return t.Name(), t.PkgPath()
}

// details is the chain of err's wrapped errors, one per line with its Go type:
// free text for people, as a traceback is.
func details(err error) string {
	var b strings.Builder
	for depth := 0; err != nil && depth < 32; depth++ {
		fmt.Fprintf(&b, "%T: %s\n", err, err.Error())
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			break
		}
		err = u.Unwrap()
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// clip makes text one the server takes: valid UTF-8 (protobuf refuses the rest
// before it is sent), no NUL (Postgres refuses it), at most limit characters.
func clip(text string, limit int) string {
	text = strings.ReplaceAll(strings.ToValidUTF8(text, "\uFFFD"), "\x00", `\0`)
	if utf8.RuneCountInString(text) <= limit {
		return text
	}
	runes := []rune(text)
	return string(runes[:limit-20]) + " ...(cut)"
}

// checkName is nil when name is a step id or function the server takes: 1 to max
// printable characters.
func checkName(what, name string, limit int) error {
	if n := utf8.RuneCountInString(name); n < 1 || n > limit {
		return fmt.Errorf("a %s must be 1-%d characters, got %q", what, limit, name)
	}
	for _, r := range name {
		if !utf8.ValidString(name) || !unicode.IsPrint(r) {
			return fmt.Errorf("a %s must be printable characters, got %q", what, name)
		}
	}
	return nil
}
