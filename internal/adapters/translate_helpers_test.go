package adapters

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Helpers shared by the translating adapters' tests (anthropic, gemini,
// azure, the Messages ingress).

// streamResult is what a client would assemble from a decoded stream.
type streamResult struct {
	kinds   []provider.EventKind
	chunks  []string // provider.EventData and provider.EventFinal outputs
	errObs  provider.Observation
	content string
	roles   []string
	tools   []*accCall // by tool_calls index
	finish  string
	usage   *chat.Usage
	ids     map[string]bool
	models  map[string]bool
}

type accCall struct {
	id, typ, name, args string
}

// runStream reads an SSE body through dec as the router does, and
// assembles the chunks as an OpenAI client would.
func runStream(t *testing.T, dec eventDecoder, sse string) streamResult {
	t.Helper()
	res := streamResult{ids: map[string]bool{}, models: map[string]bool{}}
	r := provider.NewSSEReader(strings.NewReader(sse))
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			return res
		}
		if err != nil {
			t.Fatalf("reading stream: %v", err)
		}
		out, kind, obs := dec.Event(ev)
		res.kinds = append(res.kinds, kind)
		switch kind {
		case provider.EventError:
			res.errObs = obs
		case provider.EventData, provider.EventFinal:
			if len(out) == 0 {
				continue // progress with nothing to relay (thinking)
			}
			res.chunks = append(res.chunks, string(out))
			res.accumulate(t, out)
		}
	}
}

func (res *streamResult) accumulate(t *testing.T, out []byte) {
	t.Helper()
	var c struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Delta struct {
				Role      string  `json:"role"`
				Content   *string `json:"content"`
				ToolCalls []struct {
					Index    *int   `json:"index"`
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct {
						Name      string  `json:"name"`
						Arguments *string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *chat.Usage `json:"usage"`
	}
	if err := json.Unmarshal(out, &c); err != nil {
		t.Fatalf("chunk is not JSON: %v: %s", err, out)
	}
	if c.Object != "chat.completion.chunk" || len(c.Choices) != 1 {
		t.Errorf("expected a chat.completion.chunk with one choice, got %s", out)
		return
	}
	res.ids[c.ID], res.models[c.Model] = true, true
	d := c.Choices[0].Delta
	if d.Role != "" {
		res.roles = append(res.roles, d.Role)
	}
	if d.Content != nil {
		res.content += *d.Content
	}
	for _, tc := range d.ToolCalls {
		if tc.Index == nil {
			t.Errorf("a tool call delta without index: %s", out)
			continue
		}
		for len(res.tools) <= *tc.Index {
			res.tools = append(res.tools, &accCall{})
		}
		a := res.tools[*tc.Index]
		if tc.ID != "" {
			a.id = tc.ID
		}
		if tc.Type != "" {
			a.typ = tc.Type
		}
		if tc.Function.Name != "" {
			a.name = tc.Function.Name
		}
		if tc.Function.Arguments != nil {
			a.args += *tc.Function.Arguments
		}
	}
	if f := c.Choices[0].FinishReason; f != nil {
		res.finish = *f
	}
	if c.Usage != nil {
		res.usage = c.Usage
	}
}

// lastContentKind is the kind of the last provider.EventData or provider.EventFinal.
func (res *streamResult) lastContentKind() provider.EventKind {
	for i := len(res.kinds) - 1; i >= 0; i-- {
		if k := res.kinds[i]; k == provider.EventData || k == provider.EventFinal {
			return k
		}
	}
	return provider.EventSkip
}

// withoutCreated checks that a chat.completion has a Unix "created" time,
// and returns it without, for comparing with a fixed expectation.
func withoutCreated(t *testing.T, body []byte) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("invalid JSON: %v: %s", err, body)
	}
	if c, ok := m["created"].(float64); !ok || c < 1e9 {
		t.Errorf("expected a Unix created time, got %v", m["created"])
	}
	delete(m, "created")
	out, _ := json.Marshal(m)
	return out
}

// The tests drive the built-in types as the router does: a Plan for each
// attempt, its answer and stream readers.

// byName returns the built-in provider type called name, on ep (a
// made-up account when ep has no base URL).
func byName(name string, ep provider.Endpoint) provider.Provider {
	if ep.BaseURL == "" {
		ep.BaseURL = "https://provider.invalid/v1"
	}
	switch name {
	case "openai":
		return &OpenAI{Endpoint: ep}
	case "azure":
		return &Azure{Endpoint: ep}
	case "anthropic":
		return &Anthropic{Endpoint: ep}
	case "gemini":
		return &Gemini{Endpoint: ep}
	case "bedrock":
		return &Bedrock{Endpoint: ep}
	case "vertex":
		return &Vertex{Endpoint: ep, Project: "p", Location: "us-east5"}
	}
	panic("no provider type " + name)
}

// chatReq is a Chat Completions request as the chat client API makes it.
func chatReq(body []byte, stream bool) *provider.Request {
	return &provider.Request{Format: provider.Chat, Body: body, Stream: stream, Choices: 1}
}

// chatRequest plans a Chat request on p and returns its upstream request.
func chatRequest(p provider.Provider, model string, body []byte, stream bool) (*http.Request, error) {
	plan, err := p.Plan(context.Background(), model, chatReq(body, stream))
	if err != nil {
		return nil, err
	}
	return plan.Request(), nil
}

// chatAnswer reads a successful answer of p for a Chat client.
func chatAnswer(p provider.Provider, body []byte) ([]byte, error) {
	plan, err := p.Plan(context.Background(), "", chatReq([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), false))
	if err != nil {
		return nil, err
	}
	return plan.Answer(body)
}

// eventDecoder reads one stream's events as the router's stream does:
// comments are no content, the rest goes to the plan's decoder.
type eventDecoder struct{ dec provider.EventDecoder }

// chatDecoder returns the decoder of p's streams for a Chat client.
func chatDecoder(p provider.Provider) eventDecoder {
	pl, err := p.Plan(context.Background(), "m", chatReq([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), true))
	if err != nil {
		panic(err)
	}
	built := pl.(*plan)
	return eventDecoder{built.r.decoder(built)}
}

// Event decodes ev: what to relay, its kind and the error it reports.
func (d eventDecoder) Event(ev *provider.Event) ([]byte, provider.EventKind, provider.Observation) {
	if ev.Comment {
		return nil, provider.EventSkip, provider.Observation{}
	}
	out, kind, obs := d.dec.Decode(ev)
	return out.Data, kind, obs
}
