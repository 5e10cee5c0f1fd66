package adapters

import (
	"context"
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
