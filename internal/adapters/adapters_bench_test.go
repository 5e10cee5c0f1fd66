package adapters

// Benchmarks of the adapters' share of the router's hot path (issue 6,
// bench/README.md): decoding each rate-limit dialect from a real response,
// rewriting a 4 KB chat body for a deployment, and reading a stream event
// by event. Run them with
//
//	go test -run '^$' -bench . -benchmem ./adapters

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// observeFixtures are the responses whose decoding is timed: one per
// rate-limit dialect, as the router calls Observe (the body only for an
// error status).
var observeFixtures = []struct{ dialect, adapter, file string }{
	{"openai", "openai", "openai-200.http"},
	{"openai-429", "openai", "openai-429-rpm.http"},
	{"groq", "openai", "groq-200.http"},
	{"cerebras", "openai", "cerebras-200.http"},
	{"together", "openai", "together-429.http"},
	{"mistral", "openai", "mistral-429-ratelimitbysize.http"},
	{"anthropic", "anthropic", "anthropic-200.http"},
	{"anthropic-429", "anthropic", "anthropic-429.http"},
	{"azure", "azure", "azure-429-retry-after-ms.http"},
	{"gemini-body", "gemini", "gemini-429-per-minute.http"},
}

var observeSink provider.Observation

func BenchmarkObserve(b *testing.B) {
	for _, f := range observeFixtures {
		b.Run(f.dialect, func(b *testing.B) {
			a := byName(f.adapter, provider.Endpoint{})
			resp, body := readFixture(b, f.file)
			if resp.StatusCode < 300 {
				body = nil
			}
			now := time.Date(2025, 8, 21, 12, 40, 1, 0, time.UTC)
			b.ReportAllocs()
			for b.Loop() {
				observeSink = a.Observe(resp.StatusCode, resp.Header, body, now)
			}
		})
	}
}

// chatBody4KB returns a Chat Completions body of exactly size bytes: a
// system prompt, a few turns and the usual sampling parameters.
func chatBody4KB(tb testing.TB, size int) []byte {
	tb.Helper()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body := func(pad int) []byte {
		b, err := json.Marshal(struct {
			Model       string  `json:"model"`
			Messages    []msg   `json:"messages"`
			MaxTokens   int     `json:"max_tokens"`
			Temperature float64 `json:"temperature"`
			TopP        float64 `json:"top_p"`
			Stop        string  `json:"stop"`
			User        string  `json:"user"`
		}{
			Model: "smart",
			Messages: []msg{
				{"system", "You are a careful assistant. Answer briefly, cite the documents you used, and say when you do not know. " + strings.Repeat("x", pad)},
				{"user", "Here is the quarterly report of the team; summarize the three main risks in one paragraph each."},
				{"assistant", "Sure. Which format do you prefer for the summary: bullet points or prose?"},
				{"user", "Prose, please, and keep each paragraph under eighty words."},
			},
			MaxTokens: 512, Temperature: 0.2, TopP: 0.9, Stop: "\n\nUser:", User: "user-42",
		})
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	short := body(0)
	b := body(size - len(short))
	if len(b) != size {
		tb.Fatalf("expected a %d-byte body, got %d", size, len(b))
	}
	return b
}

var requestSink *http.Request

// BenchmarkChatRequest builds the upstream request for a 4 KB body with each
// adapter: a model swap for openai and azure, a translation for anthropic
// and gemini.
func BenchmarkChatRequest(b *testing.B) {
	body := chatBody4KB(b, 4096)
	ep := &provider.Endpoint{BaseURL: "https://api.example.com/v1", APIKey: "sk-bench", Header: http.Header{}}
	ctx := context.Background()
	for _, name := range []string{"openai", "azure", "anthropic", "gemini"} {
		b.Run(name, func(b *testing.B) {
			e := *ep
			if name == "azure" {
				e.BaseURL = "https://res.openai.azure.com/openai?api-version=2024-10-21"
			}
			a := byName(name, e)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				plan, err := a.Plan(ctx, "upstream-model", chatReq(body, false))
				if err != nil {
					b.Fatal(err)
				}
				requestSink = plan.Request()
			}
		})
	}
}

// benchStream returns an upstream stream of n content events in the
// adapter's wire format, as the providers send them.
func benchStream(adapter string, n int) []byte {
	var s bytes.Buffer
	switch adapter {
	case "openai", "azure":
		if adapter == "azure" {
			s.WriteString(`data: {"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}` + "\n\n")
		}
		for i := 0; i < n; i++ {
			delta := `{"content":" word"}`
			if i == 0 {
				delta = `{"role":"assistant","content":""}`
			}
			fmt.Fprintf(&s, `data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":null}]}`+"\n\n", delta)
		}
		s.WriteString(`data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n")
		s.WriteString("data: [DONE]\n\n")
	case "anthropic":
		s.WriteString("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n")
		s.WriteString("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
		s.WriteString("event: ping\ndata: {\"type\": \"ping\"}\n\n")
		for i := 0; i < n; i++ {
			s.WriteString("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" word\"}}\n\n")
		}
		s.WriteString("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
		s.WriteString("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":200}}\n\n")
		s.WriteString("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	case "gemini":
		for i := 0; i < n; i++ {
			finish := ""
			if i == n-1 {
				finish = `,"finishReason":"STOP"`
			}
			fmt.Fprintf(&s, `data: {"candidates":[{"content":{"parts":[{"text":" word"}],"role":"model"}%s,"index":0}],"usageMetadata":{"promptTokenCount":25,"candidatesTokenCount":%d,"totalTokenCount":%d},"modelVersion":"gemini-2.5-flash","responseId":"mWq5aP2xLqGkz7IPsNiX8Ac"}`+"\r\n\r\n", finish, i+1, 26+i)
		}
	}
	return s.Bytes()
}

// BenchmarkStreamEvent reads a stream of 200 content events with provider.SSEReader.Next
// and the adapter's decoder: ns/event and allocs/event are the relay's
// per-event cost before the write to the client.
func BenchmarkStreamEvent(b *testing.B) {
	const n = 200
	for _, name := range []string{"openai", "azure", "anthropic", "gemini"} {
		b.Run(name, func(b *testing.B) {
			a := byName(name, provider.Endpoint{})
			stream := benchStream(name, n)
			events := 0
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.ReportAllocs()
			for b.Loop() {
				sse, dec := provider.NewSSEReader(bytes.NewReader(stream)), chatDecoder(a)
				content := 0
				for {
					ev, err := sse.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					events++
					if _, kind, _ := dec.Event(ev); kind == provider.EventData || kind == provider.EventFinal {
						content++
					}
				}
				if content < n {
					b.Fatalf("expected at least %d content events, got %d", n, content)
				}
			}
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(events), "allocs/event")
		})
	}
}
