package llmrouter

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// KeyHeader states the test type's key header (provider.KeyHeader), the
// one its plans put the key in.
func (*echoType) KeyHeader() (string, string) { return "X-Echo-Key", "" }

// A third party's type that states its key header can be the pass_through
// provider: what the router does not serve reaches it with its key in that
// header, the client's credentials removed. One that states none (bedrock,
// which signs its requests) is refused at load, naming the fact it lacks.
func TestPassThroughTakesTheTypesKeyHeader(t *testing.T) {
	var seen http.Header
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer upstream.Close()
	config := func(provider string) *Handler {
		return handlerFromJSON(t, `{"pass_through":"e","providers":{"e":`+provider+`},"models":{"m":{"deployments":[{"provider":"e","model":"x"}]}}}`)
	}
	h := config(`{"type":"echo_test","base_url":"` + upstream.URL + `/v1","api_key":"echo-key"}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatalf("expected a type stating its key header to be pass_through's, got %v", err)
	}
	defer h.Cleanup()
	req := httptest.NewRequest(http.MethodGet, "/v1/files", nil)
	req.Header.Set("Authorization", "Bearer client-key")
	req.Header.Set("X-Echo-Key", "client-key")
	rec := httptest.NewRecorder()
	h.passProxy.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || seen.Get("X-Echo-Key") != "echo-key" || seen.Get("Authorization") != "" {
		t.Errorf("expected 200 and the provider's key alone upstream, got %d, upstream saw %v", rec.Code, seen)
	}

	h = config(`{"type":"bedrock","region":"us-east-1"}`)
	err := h.Provision(newCaddyContext(t))
	h.Cleanup()
	if err == nil || !strings.Contains(err.Error(), "pass_through: provider e is of type bedrock, which states no key header") ||
		!strings.Contains(err.Error(), "(types that state one: anthropic, azure, echo_test, gemini, openai)") {
		t.Errorf("expected pass_through refused for a type stating no key header, got %v", err)
	}
}

// ProviderOptions of the test type: its own subdirective.
func (*echoType) ProviderOptions() []string { return []string{"greeting"} }

// A subdirective that is another type's own option names the types that
// take it, a third party's as the built-in ones; a typo of one is
// suggested.
func TestProviderOptionsAreTheTypes(t *testing.T) {
	for block, want := range map[string]string{
		"type openai\napi_key k\ngreeting hi":  "unknown subdirective greeting in provider (an option of type echo_test)",
		"type openai\napi_key k\nregion x":     "unknown subdirective region in provider (an option of type bedrock, vertex)",
		"type echo_test\napi_key k\ngreting x": `unknown subdirective greting in provider (did you mean "greeting"?)`,
		"type openai\napi_key k\nresponse x":   `unknown subdirective response in provider (did you mean "responses"?)`,
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_router {\nprovider p {\nbase_url https://api.example.com/v1\n" + block + "\n}\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: expected %q, got %v", block, want, err)
		}
	}
}

// CachePrices of the test type: a cache billed as its own (reads 0.2x,
// 5-minute writes 1.5x, 1-hour writes 3x the input price).
func (*echoType) CachePrices(model string) (read, write, write1h float64) {
	if model == "plain" {
		return 1, 1, 1
	}
	return 0.2, 1.5, 3
}

// A third party's type that states how its models' prompt cache is billed
// (provider.CachePricer) has its deployments priced so, unless the
// deployment sets its own price; a built-in type's stay as they were.
func TestCachePricesAreTheTypes(t *testing.T) {
	h := handlerFromJSON(t, `{"providers":{"e":{"type":"echo_test","base_url":"http://127.0.0.1:1/v1","api_key":"k"},
		"a":{"type":"anthropic","base_url":"http://127.0.0.1:1/v1","api_key":"k"}},
		"models":{"m":{"deployments":[{"provider":"e","model":"cached","cost_input":10,"cost_output":20},
			{"provider":"e","model":"cached-too","cost_input":10,"cost_output":20,"cost_cache_write":11},
			{"provider":"e","model":"plain","cost_input":10,"cost_output":20},
			{"provider":"a","model":"claude-sonnet-4-5","cost_input":3,"cost_output":15}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	want := [][3]float64{{2, 15, 30}, {2, 11, 30}, {10, 10, 10}, {0.3, 3.75, 6}}
	for i, d := range h.groups["m"].Deployments {
		got := [3]float64{d.CostCached, d.CostCacheWrite, d.CostCacheWrite1h}
		for j := range got {
			if diff := got[j] - want[i][j]; diff > 1e-12 || diff < -1e-12 {
				t.Errorf("%s: expected cache prices (read, write, 1h write) %v, got %v", d.Name, want[i], got)
				break
			}
		}
	}
}

// The built-in modules state their adapters' facts (promoted from the
// embedded adapter: nothing of the module hides them).
func TestBuiltInModulesStateTheirFacts(t *testing.T) {
	for _, name := range []string{"openai", "azure", "anthropic", "gemini", "bedrock", "vertex"} {
		info, err := caddy.GetModule(ProviderNamespace + "." + name)
		if err != nil {
			t.Fatal(err)
		}
		m := info.New()
		_, keyed := m.(provider.KeyHeader)
		_, named := m.(provider.TraceNamer)
		_, continues := m.(provider.Continuer)
		if keyed != (name != "bedrock" && name != "vertex") || !named || !continues {
			t.Errorf("%s: expected its facts stated, got key header %v, tracing name %v, continuation %v", name, keyed, named, continues)
		}
	}
}

// A client's credentials in any registered type's key header (a third
// party's too) never reach the pass_through provider, whatever its type.
func TestPassThroughDropsEveryTypesKeyHeader(t *testing.T) {
	var seen http.Header
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer upstream.Close()
	h := handlerFromJSON(t, `{"pass_through":"o","providers":{"o":{"type":"openai","base_url":"`+upstream.URL+`/v1","api_key":"sk-provider"}},
		"models":{"m":{"deployments":[{"provider":"o","model":"x"}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	req := httptest.NewRequest(http.MethodGet, "/v1/files", nil)
	for _, k := range []string{"X-Echo-Key", "X-Api-Key", "Api-Key", "X-Goog-Api-Key"} {
		req.Header.Set(k, "client-secret")
	}
	rec := httptest.NewRecorder()
	h.passProxy.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || seen.Get("Authorization") != "Bearer sk-provider" {
		t.Fatalf("expected 200 with the provider's key, got %d, upstream saw %v", rec.Code, seen)
	}
	for k, vs := range seen {
		for _, v := range vs {
			if strings.Contains(v, "client-secret") {
				t.Errorf("the client's credential reached the provider in %s", k)
			}
		}
	}
}
