package llmrouter

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/router"
)

func newCaddyContext(t testing.TB) caddy.Context {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx
}

// postJSON is a client's POST of a JSON body to path, as the SDKs send it
// (with Content-Type application/json).
func postJSON(path, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

// handlerFromCaddyfile is the Handler of a Caddyfile block (cfg), parsed
// and provisioned; the caller cleans it up (Handler.Cleanup).
func handlerFromCaddyfile(t testing.TB, cfg string) *Handler {
	t.Helper()
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(cfg)); err != nil {
		t.Fatal(err)
	}
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	return h
}

func handlerFromJSON(t *testing.T, raw string) *Handler {
	t.Helper()
	h := new(Handler)
	if err := json.Unmarshal([]byte(raw), h); err != nil {
		t.Fatal(err)
	}
	return h
}

const jsonConfig = `{
	"providers": {
		"a": {"type": "openai", "base_url": "http://127.0.0.1:1/v1", "api_key": "sk-secret-a"},
		"b": {"type": "openai", "base_url": "https://api.example.com/v1/", "api_key": "{env.LLM_ROUTER_TEST_KEY}"}
	},
	"models": {
		"fast": {"deployments": [{"provider": "a", "model": "m1"}, {"provider": "b", "model": "m2", "quality": 0.5}]}
	}
}`

func TestProvisionAndReloadKeepState(t *testing.T) {
	t.Setenv("LLM_ROUTER_TEST_KEY", "sk-from-env")
	first := handlerFromJSON(t, jsonConfig)
	if err := first.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	group := first.groups["fast"].Deployments
	ep := group[1].Provider.(ProviderModule).ProviderSettings().ProviderEndpoint()
	if len(group) != 2 || ep.APIKey != "sk-from-env" || ep.BaseURL != "https://api.example.com/v1" {
		t.Fatalf("expected the env key and a trimmed base URL, got %+v", ep)
	}
	if r := first.router; r.Deadline != router.DefaultDeadline || r.MaxAttempts != router.DefaultMaxAttempts ||
		r.Policy != capacity.DefaultPolicy || first.maxBody() != DefaultMaxBody {
		t.Errorf("expected defaults, got %v %d %+v %d", r.Deadline, r.MaxAttempts, r.Policy, first.maxBody())
	}
	if d := group[0]; d.Timeout != router.DefaultTimeout || d.TTFTTimeout != router.DefaultTTFTTimeout ||
		d.IdleTimeout != router.DefaultIdleTimeout || d.Weight != 1 {
		t.Errorf("expected the provider's default timeouts and weight 1, got %v %v %v %d", d.Timeout, d.TTFTTimeout, d.IdleTimeout, d.Weight)
	}
	for _, ref := range first.states {
		if strings.Contains(ref.key, "sk-") {
			t.Errorf("a state key must not hold the API key: %s", ref.key)
		}
	}

	// A reload with new weights but the same identities keeps the states:
	// the new config provisions before the old one is cleaned up.
	second := handlerFromJSON(t, strings.Replace(jsonConfig, `"quality": 0.5`, `"quality": 0.9`, 1))
	if err := second.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	_ = first.Cleanup()
	if second.groups["fast"].Deployments[0].State != group[0].State || second.groups["fast"].Deployments[1].State != group[1].State {
		t.Error("expected the capacity states to survive the reload")
	}

	// A changed key is a new identity: fresh state.
	third := handlerFromJSON(t, strings.Replace(jsonConfig, "sk-secret-a", "sk-rotated", 1))
	if err := third.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	if third.groups["fast"].Deployments[0].State == group[0].State {
		t.Error("expected a new key to start with a fresh state")
	}
	_ = second.Cleanup()
	_ = third.Cleanup()
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct{ name, config, want string }{
		{"unknown provider", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h/v1"}},"models":{"m":{"deployments":[{"provider":"x","model":"y"}]}}}`, `unknown provider "x"`},
		{"fallback unknown", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h/v1"}},"models":{"m":{"fallback_group":"n","deployments":[{"provider":"a","model":"y"}]}}}`, `model m: fallback_group names unknown model group "n" (configured: m)`},
		{"fallback chain", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h/v1"}},"models":{"g0":{"fallback_group":"g1","deployments":[{"provider":"a","model":"m0"}]},"g1":{"fallback_group":"g2","deployments":[{"provider":"a","model":"m1"}]},"g2":{"fallback_group":"g3","deployments":[{"provider":"a","model":"m2"}]},"g3":{"fallback_group":"g4","deployments":[{"provider":"a","model":"m3"}]},"g4":{"fallback_group":"g5","deployments":[{"provider":"a","model":"m4"}]},"g5":{"fallback_group":"g6","deployments":[{"provider":"a","model":"m5"}]},"g6":{"fallback_group":"g7","deployments":[{"provider":"a","model":"m6"}]},"g7":{"fallback_group":"g8","deployments":[{"provider":"a","model":"m7"}]},"g8":{"fallback_group":"g9","deployments":[{"provider":"a","model":"m8"}]},"g9":{"fallback_group":"g10","deployments":[{"provider":"a","model":"m9"}]},"g10":{"fallback_group":"g11","deployments":[{"provider":"a","model":"m10"}]},"g11":{"fallback_group":"g12","deployments":[{"provider":"a","model":"m11"}]},"g12":{"fallback_group":"g13","deployments":[{"provider":"a","model":"m12"}]},"g13":{"fallback_group":"g14","deployments":[{"provider":"a","model":"m13"}]},"g14":{"fallback_group":"g15","deployments":[{"provider":"a","model":"m14"}]},"g15":{"fallback_group":"g16","deployments":[{"provider":"a","model":"m15"}]},"g16":{"fallback_group":"g17","deployments":[{"provider":"a","model":"m16"}]},"g17":{"fallback_group":"g18","deployments":[{"provider":"a","model":"m17"}]},"g18":{"deployments":[{"provider":"a","model":"m18"}]}}}`, "model g0: fallback_group makes a chain of more than 16 fallback groups"},
		{"fallback loop", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h/v1"}},"models":{"m":{"fallback_group":"n","deployments":[{"provider":"a","model":"y"}]},"n":{"fallback_group":"m","deployments":[{"provider":"a","model":"z"}]}}}`, `model m: fallback_group makes a loop: m -> n -> m`},
		{"no deployment", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h/v1"}},"models":{"m":{"deployments":[]}}}`, "no deployment"},
		{"no model", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h/v1"}}}`, "no model group"},
		{"unknown type", `{"providers":{"a":{"type":"palm","base_url":"http://h/v1"}},"models":{"m":{"deployments":[{"provider":"a","model":"y"}]}}}`, `unknown provider type "palm"`},
		{"bad base_url", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"ftp://h"}},"models":{"m":{"deployments":[{"provider":"a","model":"y"}]}}}`, "absolute http or https URL"},
		{"query in base_url", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h/v1?key=abc"}},"models":{"m":{"deployments":[{"provider":"a","model":"y"}]}}}`, "query or fragment"},
		{"negative timeout", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h","timeout":-1}},"models":{"m":{"deployments":[{"provider":"a","model":"y"}]}}}`, "must not be negative"},
		{"quality", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h"}},"models":{"m":{"deployments":[{"provider":"a","model":"y","quality":3}]}}}`, "quality"},
		{"header name", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h","headers":{"Bad Header\n":["x"]}}},"models":{"m":{"deployments":[{"provider":"a","model":"y"}]}}}`, "not a valid header name"},
		{"header value", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h","headers":{"X-A":["a\nb"]}}},"models":{"m":{"deployments":[{"provider":"a","model":"y"}]}}}`, "not a valid header value"},
		{"backoff", `{"backoff_base":2000000000,"backoff_max":1000000000,"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h"}},"models":{"m":{"deployments":[{"provider":"a","model":"y"}]}}}`, "must not exceed backoff_max"},
		{"affinity word", `{"affinity":"bogus","providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h"}},"models":{"m":{"deployments":[{"provider":"a","model":"y"}]}}}`, `affinity: "bogus" is not body, none or a placeholder`},
		{"negative max_queued", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h"}},"models":{"m":{"max_queued":-1,"deployments":[{"provider":"a","model":"y"}]}}}`, "model m: max_queued must be a whole number from 1 to 2147483647, got -1"},
		{"negative max_stream_bytes", `{"max_stream_bytes":-1,"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h"}},"models":{"m":{"deployments":[{"provider":"a","model":"y"}]}}}`, "max_stream_bytes must not be negative"},
		{"unnamed group", `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h"}},"models":{"":{"deployments":[{"provider":"a","model":"y"}]}}}`, "needs a name"},
		{"unnamed provider", `{"providers":{"":{"type":"openai","api_key":"none","base_url":"http://h"}},"models":{"m":{"deployments":[{"provider":"","model":"y"}]}}}`, "needs a name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := handlerFromJSON(t, tc.config)
			err := h.Provision(newCaddyContext(t))
			_ = h.Cleanup()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("expected an error containing %q, got %v", tc.want, err)
			}
		})
	}
	h := handlerFromJSON(t, `{"deadline":-5}`)
	if err := h.Provision(newCaddyContext(t)); err == nil || !strings.Contains(err.Error(), "deadline must not be negative") {
		t.Errorf("expected a negative deadline rejected, got %v", err)
	}
}

// The admin API shows no userinfo of a base URL, and the router is told
// the key and the password to redact from providers' answers.
func TestAdminHidesSecrets(t *testing.T) {
	h := handlerFromJSON(t, `{"providers":{"a":{"type":"openai","base_url":"http://user:pass-word@127.0.0.1:1/v1","api_key":"sk-secret-admin"}},
		"models":{"m":{"deployments":[{"provider":"a","model":"x"}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	d := h.groups["m"].Deployments[0]
	if got := h.meta[d].baseURL; strings.Contains(got, "pass-word") || got != "http://xxxxx@127.0.0.1:1/v1" {
		t.Errorf("expected the userinfo hidden, got %q", got)
	}
	for _, want := range []string{"sk-secret-admin", "pass-word"} {
		if !slices.Contains(d.Secrets, want) {
			t.Errorf("expected %q among the secrets, got %d secrets", want, len(d.Secrets))
		}
	}

	// A key given in a header line is a secret too; other headers are not.
	h = handlerFromJSON(t, `{"providers":{"a":{"type":"openai","base_url":"http://127.0.0.1:1/v1",
		"headers":{"Authorization":["Bearer gw-token-12345"],"X-Goog-Api-Key":["goog-key-6789"],"Anthropic-Version":["2023-06-01"]}}},
		"models":{"m":{"deployments":[{"provider":"a","model":"x"}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	got := strings.Join(h.groups["m"].Deployments[0].Secrets, " | ")
	for _, want := range []string{"Bearer gw-token-12345", "gw-token-12345", "goog-key-6789"} {
		if !slices.Contains(h.groups["m"].Deployments[0].Secrets, want) {
			t.Errorf("expected %q among the secrets, got %s", want, got)
		}
	}
	if strings.Contains(got, "2023-06-01") {
		t.Errorf("expected a version header not to be a secret, got %s", got)
	}
}

// One deployment in two groups is one account and model: the tightest
// declared limits hold, whichever group a request names.
func TestDeclaredLimitsOfASharedDeployment(t *testing.T) {
	h := handlerFromJSON(t, `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://127.0.0.1:1/v1"}},
		"models":{"limited":{"deployments":[{"provider":"a","model":"x","rpm":2,"tpm":5000}]},
		"other":{"deployments":[{"provider":"a","model":"x","tpm":3000}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	st := h.groups["other"].Deployments[0].State
	if h.groups["limited"].Deployments[0].State != st {
		t.Fatal("expected one state for one deployment")
	}
	if snap := st.Snapshot(time.Now()); snap.DeclaredRPM != 2 || snap.DeclaredTPM != 3000 {
		t.Errorf("expected rpm 2 and tpm 3000, got %d %d", snap.DeclaredRPM, snap.DeclaredTPM)
	}
}
