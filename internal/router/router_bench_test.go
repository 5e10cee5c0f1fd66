package router

// Benchmarks of the router's per-request and per-event work without a
// network (issue 6, bench/README.md). Ranking 16 deployments is
// BenchmarkRank16 in score_test.go. Run them with
//
//	go test -run '^$' -bench . -benchmem ./router

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"testing"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// benchChunks returns an OpenAI stream of n content chunks, a final chunk
// and [DONE].
func benchChunks(n int) []byte {
	var s bytes.Buffer
	for i := 0; i < n; i++ {
		delta := `{"content":" word"}`
		if i == 0 {
			delta = `{"role":"assistant","content":""}`
		}
		fmt.Fprintf(&s, `data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":null}]}`+"\n\n", delta)
	}
	s.WriteString(`data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n")
	s.WriteString("data: [DONE]\n\n")
	return s.Bytes()
}

// answer is a fake provider that answers every attempt with status, header
// and a fresh reader over body.
func answer(status int, h http.Header, body []byte) *script {
	return &script{replies: []func(*http.Request) (*http.Response, error){
		func(req *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(bytes.NewReader(body)), Request: req}, nil
		},
	}}
}

// BenchmarkRelayPerEvent relays a stream of N chunks through Serve and
// Stream.Relay to a writer that drops them: ns/event is the relay's cost
// per event (the events=1 case is the fixed cost of a streaming request:
// the exchange, the first event, the timers).
//
// resume=off relays without the transcript a resume reads (Router.Resume),
// resume=same_model (the default) with it.
func BenchmarkRelayPerEvent(b *testing.B) {
	for _, mode := range []ResumeMode{ResumeOff, ResumeSameModel} {
		for _, n := range []int{1, 200} {
			benchRelay(b, mode, n)
		}
	}
}

func benchRelay(b *testing.B, mode ResumeMode, n int) {
	{
		b.Run(fmt.Sprintf("resume=%s/events=%d", mode, n), func(b *testing.B) {
			stream := benchChunks(n)
			d := deployment("d", answer(200, http.Header{"Content-Type": {"text/event-stream"}}, stream))
			group := []*Deployment{d}
			r := New()
			r.Resume = mode
			req := &Request{Request: wire(chatReq.Body, true), Tokens: 10}
			ctx := context.Background()
			relayed := 0
			drop := func(ev provider.Event, done bool) error {
				relayed++
				return nil
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.ReportAllocs()
			for b.Loop() {
				res := r.Serve(ctx, group, req)
				if res.Stream == nil {
					b.Fatalf("expected a stream, got %v", res.Err)
				}
				if err := res.Stream.Relay(drop); err != nil {
					b.Fatal(err)
				}
			}
			runtime.ReadMemStats(&after)
			// Each stream relays its n chunks, the final chunk and the end.
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(relayed), "ns/event")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(relayed), "allocs/event")
		})
	}
}

// BenchmarkServeNonStreaming is one non-streaming request through Serve
// (ranking, the upstream request, reading and checking the answer, the
// capacity update) over 1 deployment, and over 8 whose answers carry
// x-ratelimit-* headers: the router's CPU per request without the network
// and without Caddy.
func BenchmarkServeNonStreaming(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-bench","object":"chat.completion","created":1732900000,"model":"bench-up","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! This is a fixed answer."},"finish_reason":"stop"}],"usage":{"prompt_tokens":250,"completion_tokens":12,"total_tokens":262}}`)
	plain := http.Header{"Content-Type": {"application/json"}}
	limited := http.Header{
		"Content-Type":                   {"application/json"},
		"X-Ratelimit-Limit-Requests":     {"10000"},
		"X-Ratelimit-Limit-Tokens":       {"2000000"},
		"X-Ratelimit-Remaining-Requests": {"9999"},
		"X-Ratelimit-Remaining-Tokens":   {"1999000"},
		"X-Ratelimit-Reset-Requests":     {"6ms"},
		"X-Ratelimit-Reset-Tokens":       {"30ms"},
	}
	// A longer answer (4 KB of content), with its Content-Length as a
	// provider states it.
	long := bytes.Replace(body, []byte("Hello! This is a fixed answer."), bytes.Repeat([]byte("A longer answer. "), 240), 1)
	for _, c := range []struct {
		name string
		n    int
		h    http.Header
		body []byte
	}{{"deployments=1", 1, plain, body}, {"deployments=8-ratelimit-headers", 8, limited, body}, {"deployments=1-answer=4KB", 1, plain, long}} {
		b.Run(c.name, func(b *testing.B) {
			group := make([]*Deployment, c.n)
			for i := range group {
				s := answer(200, c.h, c.body)
				reply := s.replies[0]
				s.replies[0] = func(req *http.Request) (*http.Response, error) {
					resp, err := reply(req)
					resp.ContentLength = int64(len(c.body))
					return resp, err
				}
				group[i] = deployment(fmt.Sprintf("d%d", i), s)
			}
			r := New()
			g := NewGroup("bench", group) // as the handler holds it: one per config
			req := &Request{Request: wire(chatReq.Body, false), PromptTokens: 20, Tokens: 20}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if res := r.ServeGroup(ctx, g, req); res.Status != 200 {
					b.Fatalf("expected 200, got %d %v", res.Status, res.Err)
				}
			}
		})
	}
}
