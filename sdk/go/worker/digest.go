package worker

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
)

// WithArgs records with the call a digest of the arguments its function works on,
// so that a replay can tell that a recorded call is now made with other arguments:
// the SHA-256 of the canonical JSON of [args, {}], as every Cyclone SDK computes it
// (docs/other-languages.md, "The arguments digest"). When the journal holds the call
// with another digest, the node fails for good with a ReplayMismatch failure. An
// argument that is not JSON fails the node too (ArgumentsNotJson): a digest that
// left it out would miss its change.
//
// Numbers are written as Go's encoding/json writes them: a float64 with no fraction
// is written as an integer (Python writes 1.0), so a body whose journal another
// language writes should pass integral values as integers.
func WithArgs(args ...any) CallOption {
	return func(o *callOptions) {
		if args == nil {
			args = []any{}
		}
		o.digest, o.digestErr = argsDigest([]any{args, map[string]any{}})
	}
}

// argsDigest is the SHA-256, in lowercase hex, of the canonical JSON of v.
func argsDigest(v any) (string, error) {
	text, err := canonicalJSON(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(text)
	return hex.EncodeToString(sum[:]), nil
}

// canonicalJSON writes v as JSON with object keys sorted by code point, no
// whitespace, and strings with only the escapes JSON requires.
func canonicalJSON(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // numbers keep the text encoding/json gave them
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	writeCanonical(&out, tree)
	return out.Bytes(), nil
}

func writeCanonical(out *bytes.Buffer, v any) {
	switch v := v.(type) {
	case nil:
		out.WriteString("null")
	case bool:
		out.WriteString(strconv.FormatBool(v))
	case json.Number:
		out.WriteString(string(v))
	case string:
		writeString(out, v)
	case []any:
		out.WriteByte('[')
		for i, item := range v {
			if i > 0 {
				out.WriteByte(',')
			}
			writeCanonical(out, item)
		}
		out.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		// Code point order: Go compares strings by their UTF-8 bytes, which is the
		// same order as by code points.
		sort.Strings(keys)
		out.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				out.WriteByte(',')
			}
			writeString(out, k)
			out.WriteByte(':')
			writeCanonical(out, v[k])
		}
		out.WriteByte('}')
	default:
		panic(fmt.Sprintf("canonicalJSON: unexpected %T", v))
	}
}

// writeString writes s as a JSON string with only the escapes JSON requires: the
// quote, the backslash and the control characters (as Python's json module writes
// them with ensure_ascii=False).
func writeString(out *bytes.Buffer, s string) {
	out.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			out.WriteString(`\"`)
		case r == '\\':
			out.WriteString(`\\`)
		case r == '\n':
			out.WriteString(`\n`)
		case r == '\r':
			out.WriteString(`\r`)
		case r == '\t':
			out.WriteString(`\t`)
		case r == '\b':
			out.WriteString(`\b`)
		case r == '\f':
			out.WriteString(`\f`)
		case r < 0x20:
			fmt.Fprintf(out, `\u%04x`, r)
		default:
			out.WriteRune(r)
		}
	}
	out.WriteByte('"')
}
