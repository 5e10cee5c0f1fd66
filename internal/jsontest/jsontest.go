// Package jsontest compares and reads JSON texts in tests.
package jsontest

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// Same reports whether got and want hold the same JSON value (members in
// any order, "\u003e" read as ">"). It fails t when got is not JSON or want
// is not (a bad expectation).
func Same(t testing.TB, got []byte, want string) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("got invalid JSON: %v: %s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad expectation: %v: %s", err, want)
	}
	return reflect.DeepEqual(g, w)
}

// Field decodes the value of the top-level member key of body (nil when
// absent), failing t when body is not a JSON object.
func Field(t testing.TB, body []byte, key string) any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("invalid JSON: %v: %s", err, body)
	}
	return m[key]
}

// Compact renders JSON on one line, for messages; s as it is when it is no
// JSON.
func Compact(s string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return s
	}
	return b.String()
}

// Set returns body with the value of its top-level member key replaced by
// value (a fresh id made fixed, for a comparison), the members' order
// kept; it fails t when body has no such member.
func Set(t testing.TB, body []byte, key string, value any) []byte {
	t.Helper()
	start, end, err := jsonbody.FindMember(body, key)
	if err != nil || start < 0 {
		t.Fatalf("no member %s in %s (%v)", key, body, err)
	}
	v, err := json.Marshal(value)
	if err != nil {
		t.Fatal(err)
	}
	return append(append(append([]byte{}, body[:start]...), v...), body[end:]...)
}
