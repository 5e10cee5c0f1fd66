package jsonbody

import (
	"encoding/json"
	"testing"
)

type benchDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

// BenchmarkMarshal compares Marshal with json.Marshal on a stream
// chunk's delta, what the router marshals per translated event.
func BenchmarkMarshal(b *testing.B) {
	d := benchDelta{Content: "if a > b { return a }"}
	b.Run("jsonbody", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = Marshal(d)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(d)
		}
	})
}
