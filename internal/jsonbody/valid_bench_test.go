package jsonbody

import "testing"

// benchChunk is an OpenAI Chat Completions stream chunk as a provider
// sends it (the shape of every content event a stream relays).
var benchChunk = []byte(`{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}`)

// BenchmarkScanChunk is the JSON check of one stream chunk with a note of
// each string (what chatStream.Decode does to every event), and the walk
// of its members and its choice's delta (what a resume's transcript
// does): ns/op per chunk.
func BenchmarkScanChunk(b *testing.B) {
	b.Run("scan", func(b *testing.B) {
		note := func([]byte, int, int) {}
		for b.Loop() {
			if !Scan(benchChunk, note) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("members", func(b *testing.B) {
		for b.Loop() {
			start, end, err := FindMember(benchChunk, "choices")
			if err != nil || start < 0 {
				b.Fatal("no choices")
			}
			_ = EachElement(benchChunk[start:end], func(s, e int) bool {
				return EachMember(benchChunk[start+s:start+e], func([]byte, int, int) bool { return true }) == nil
			})
		}
	})
}
