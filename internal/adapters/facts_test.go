package adapters

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// unknownFormat stands for a client API added after the adapters were
// written: no adapter may claim it.
const unknownFormat = provider.Format(200)

// TestServesListsItsFormats: each built-in type serves exactly the formats
// it plans, listed; a format it does not know (a new client API) is not
// served, so the router never sends it a request it would misread.
func TestServesListsItsFormats(t *testing.T) {
	all := []provider.Format{provider.Chat, provider.Embeddings, provider.Messages, provider.Responses, provider.Completions}
	claude := []provider.Format{provider.Chat, provider.Messages, provider.Responses}
	for name, want := range map[string][]provider.Format{
		"openai": all, "azure": all, "anthropic": claude, "gemini": claude, "bedrock": claude, "vertex": claude,
	} {
		p := byName(name, provider.Endpoint{})
		for _, f := range append(slices.Clone(all), unknownFormat, provider.Format(255)) {
			if got := p.Serves(f); got != slices.Contains(want, f) {
				t.Errorf("%s: expected Serves(%s) %v, got %v", name, f, !got, got)
			}
		}
	}
}

// TestUnservedFormatIsNotPlanned: a format a type does not serve is
// refused by its Plan too (nothing sent), whatever the body.
func TestUnservedFormatIsNotPlanned(t *testing.T) {
	for _, name := range []string{"openai", "azure", "anthropic", "gemini", "bedrock", "vertex"} {
		p := byName(name, provider.Endpoint{})
		r := &provider.Request{Format: unknownFormat, Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), Choices: 1}
		if plan, err := p.Plan(context.Background(), "claude-sonnet-4-5", r); err == nil {
			t.Errorf("%s: expected an unknown format to be refused, got a plan to %s", name, plan.Request().URL)
		}
	}
}

// TestTypesStateTheirFacts: each built-in type states its key header (the
// one its plans put the key in), its gen_ai.provider.name and how each kind
// of its models continues a final assistant message.
func TestTypesStateTheirFacts(t *testing.T) {
	for _, c := range []struct {
		name, header, prefix, system string
		continuation                 map[string]provider.Continuation
	}{
		{"openai", "Authorization", "Bearer ", "openai", map[string]provider.Continuation{"gpt-4o": provider.NoContinuation}},
		{"azure", "Api-Key", "", "azure.ai.openai", map[string]provider.Continuation{"gpt-4o": provider.NoContinuation}},
		{"anthropic", "X-Api-Key", "", "anthropic", map[string]provider.Continuation{"claude-sonnet-4-5": provider.Prefill}},
		{"gemini", "X-Goog-Api-Key", "", "gcp.gemini", map[string]provider.Continuation{"gemini-2.5-flash": provider.NoContinuation}},
		{"bedrock", "", "", "aws.bedrock", map[string]provider.Continuation{
			"us.anthropic.claude-sonnet-4-5-20250929-v1:0": provider.Prefill, "amazon.nova-pro-v1:0": provider.NoContinuation}},
		{"vertex", "", "", "gcp.vertex_ai", map[string]provider.Continuation{
			"claude-sonnet-4-5@20250929": provider.Prefill, "gemini-2.5-flash": provider.NoContinuation}},
	} {
		p := byName(c.name, provider.Endpoint{APIKey: "sk-test"})
		kh, ok := p.(provider.KeyHeader)
		if ok != (c.header != "") {
			t.Errorf("%s: expected a key header %v, got %v", c.name, c.header != "", ok)
		}
		if ok {
			name, prefix := kh.KeyHeader()
			req, err := chatRequest(p, "gpt-4o", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), false)
			if err != nil {
				t.Fatal(err)
			}
			if name != c.header || prefix != c.prefix || req.Header.Get(name) != prefix+"sk-test" {
				t.Errorf("%s: expected the key in %s as %q, stated %s %q, sent %v", c.name, c.header, c.prefix+"sk-test", name, prefix, req.Header)
			}
		}
		if tn, ok := p.(provider.TraceNamer); !ok || tn.GenAIProviderName() != c.system {
			t.Errorf("%s: expected gen_ai.provider.name %q, got %v", c.name, c.system, ok && tn.GenAIProviderName() != "")
		}
		for model, want := range c.continuation {
			if got := p.(provider.Continuer).ContinuationFor(model); got != want {
				t.Errorf("%s: expected %s to continue by %s, got %s", c.name, model, want, got)
			}
			// Its Plan agrees: it refuses a continuation only when it says none.
			r := chatReq([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel"}]}`), true)
			_, err := p.Plan(context.Background(), model, r.Continued(r.Body))
			if errors.Is(err, provider.ErrNoContinuation) != (want == provider.NoContinuation) {
				t.Errorf("%s: %s states %s, but its Plan of a continuation says %v", c.name, model, want, err)
			}
		}
	}
}
