package adapters

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"
	"github.com/llmrouter/caddy-llm-router/provider"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/claude-plans.golden from the current plans")

// TestClaudePlansGolden: the plans of Anthropic's models on the three
// types that serve them (anthropic, bedrock, vertex), in every request
// shape (Messages as it came or Chat translated, streamed or not, with the
// client's version and beta headers, a resume's continuation, one Claude
// refuses), byte for byte as recorded in testdata/claude-plans.golden:
// method, URL, headers, body, the plan's format and whether it is native,
// and how it reads an answer.
func TestClaudePlansGolden(t *testing.T) {
	var out bytes.Buffer
	for _, p := range []struct {
		name   string
		p      provider.Provider
		models []string
	}{
		{"anthropic", &Anthropic{Endpoint: provider.Endpoint{BaseURL: "https://api.anthropic.com/v1", APIKey: "sk-ant-test",
			Header: http.Header{"X-Extra": {"1"}}}}, []string{"claude-sonnet-4-5"}},
		{"bedrock", &Bedrock{Endpoint: provider.Endpoint{BaseURL: "https://bedrock-runtime.us-east-1.amazonaws.com", APIKey: "bedrock-key"}},
			[]string{"us.anthropic.claude-sonnet-4-5-20250929-v1:0", "arn:aws:bedrock:us-east-1:1:inference-profile/us.anthropic.claude-x"}},
		{"vertex", &Vertex{Endpoint: provider.Endpoint{BaseURL: "https://us-east5-aiplatform.googleapis.com/v1"}, Project: "proj", Location: "us-east5"},
			[]string{"claude-sonnet-4-5@20250929", "publishers/anthropic/models/claude-opus-4"}},
	} {
		for _, model := range p.models {
			for _, c := range claudeShapes() {
				fmt.Fprintf(&out, "=== %s %s: %s\n", p.name, model, c.name)
				writePlan(&out, p.p, model, c.req)
			}
		}
	}
	// A translated answer's "created" is the time it was read, a stream's
	// chunk id made at random.
	got := regexp.MustCompile(`"created":\d+`).ReplaceAll(out.Bytes(), []byte(`"created":0`))
	got = regexp.MustCompile(`"chatcmpl-[A-Z0-9]+"`).ReplaceAll(got, []byte(`"chatcmpl-0"`))
	path := filepath.Join("testdata", "claude-plans.golden")
	if *updateGolden {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		gotL, wantL := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gotL), len(wantL)) {
			g, w := "", ""
			if i < len(gotL) {
				g = gotL[i]
			}
			if i < len(wantL) {
				w = wantL[i]
			}
			if g != w {
				t.Fatalf("plans differ from %s at line %d:\nexpected %s\ngot      %s", path, i+1, w, g)
			}
		}
	}
}

type claudeShape struct {
	name string
	req  *provider.Request
}

// claudeShapes are the request shapes a Claude plan is made of.
func claudeShapes() []claudeShape {
	const msgs = `{"model":"group","max_tokens":64,"stream":true,"anthropic_version":"client","messages":[{"role":"user","content":"hi"}]}`
	const withBeta = `{"model":"group","max_tokens":64,"anthropic_beta":["own-beta"],"messages":[{"role":"user","content":"hi"}]}`
	const thinking = `{"model":"group","max_tokens":2048,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel"}]}`
	const prefilled = `{"model":"group","max_tokens":64,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel"}]}`
	const chat = `{"model":"group","max_tokens":64,"stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`
	const chatPrefilled = `{"model":"group","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel"}]}`
	header := http.Header{"Anthropic-Version": {"2023-06-01"}, "Anthropic-Beta": {"context-1m-2025-08-07, interleaved-thinking-2025-05-14", "extra"}}
	m := func(body string, stream bool, h http.Header) *provider.Request {
		return &provider.Request{Format: provider.Messages, Body: []byte(body), Stream: stream, Header: h, ToChat: messages.ToChat}
	}
	c := func(body string, stream bool) *provider.Request {
		return &provider.Request{Format: provider.Chat, Body: []byte(body), Stream: stream, Choices: 1}
	}
	r := func(req *provider.Request) *provider.Request { return req.Continued(req.Body) }
	return []claudeShape{
		{"messages", m(msgs, false, nil)},
		{"messages streamed, client headers", m(msgs, true, header)},
		{"messages with its own anthropic_beta, client headers", m(withBeta, false, header)},
		{"messages continued", r(m(prefilled, true, nil))},
		{"messages continued, thinking on", r(m(thinking, true, nil))},
		{"chat", c(chat, false)},
		{"chat streamed", c(chat, true)},
		{"chat continued", r(c(chatPrefilled, true))},
		{"responses through chat", &provider.Request{Format: provider.Responses, Body: []byte(`{"model":"group","input":"hi"}`),
			ToChat: func([]byte) ([]byte, error) { return []byte(chatPrefilled), nil }}},
		{"embeddings", &provider.Request{Format: provider.Embeddings, Body: []byte(`{"model":"group","input":"hi"}`)}},
	}
}

// writePlan writes what a plan of req on p is: the upstream request and
// how its answers are read, or why there is none.
func writePlan(w io.Writer, p provider.Provider, model string, req *provider.Request) {
	plan, err := p.Plan(context.Background(), model, req)
	if err != nil {
		fmt.Fprintf(w, "error: %v\n", err)
		return
	}
	hr := plan.Request()
	fmt.Fprintf(w, "%s %s\nformat %s native %v\n", hr.Method, hr.URL, plan.Format(), plan.Native())
	keys := make([]string, 0, len(hr.Header))
	for k := range hr.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "%s: %q\n", k, hr.Header[k])
	}
	body, _ := io.ReadAll(hr.Body)
	fmt.Fprintf(w, "body %s\n", body)
	const answer = `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"lo"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}`
	a, err := plan.Answer([]byte(answer))
	fmt.Fprintf(w, "answer %s %v\n", a, err)
	ev := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n"
	if s := plan.Stream(strings.NewReader(ev)); s != nil {
		out, kind, _, err := s.Next()
		fmt.Fprintf(w, "stream %s %d %v\n", out.Data, kind, err)
	}
}
