package llmrouter

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// echoType is a provider type as a third party would write one, in its
// own package: a module in ProviderNamespace that embeds ProviderConfig,
// takes an option of its own, and speaks its own wire format.
type echoType struct {
	ProviderConfig
	// Greeting is the type's own option.
	Greeting string `json:"greeting,omitempty"`
}

func init() { caddy.RegisterModule(echoType{}) }

func (echoType) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: ProviderNamespace + ".echo_test", New: func() caddy.Module { return new(echoType) }}
}

func (e *echoType) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return ParseProviderBlock(d, &e.ProviderConfig, func(d *caddyfile.Dispenser) (bool, error) {
		if d.Val() != "greeting" {
			return false, nil
		}
		if !d.AllArgs(&e.Greeting) {
			return true, d.ArgErr()
		}
		return true, nil
	})
}

func (*echoType) Serves(f provider.Format) bool { return f == provider.Chat }

func (e *echoType) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	ep := e.ProviderEndpoint()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.BaseURL+"/echo/"+model, bytes.NewReader(r.Body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Echo-Key", ep.APIKey)
	return echoPlan{req: req, greeting: e.Greeting}, nil
}

func (*echoType) Observe(status int, _ http.Header, body []byte, _ time.Time) provider.Observation {
	if status >= 300 {
		o := provider.NewObservation(provider.Server)
		o.Message = string(body)
		return o
	}
	return provider.NewObservation(provider.OK)
}

type echoPlan struct {
	req      *http.Request
	greeting string
}

func (p echoPlan) Request() *http.Request         { return p.req }
func (echoPlan) Format() provider.Format          { return provider.Chat }
func (echoPlan) Native() bool                     { return false }
func (echoPlan) Stream(io.Reader) provider.Stream { return nil }

// Answer turns the echo into a chat.completion.
func (p echoPlan) Answer(body []byte) ([]byte, error) {
	return json.Marshal(map[string]any{"id": "e", "object": "chat.completion", "model": "echo",
		"choices": []map[string]any{{"index": 0, "finish_reason": "stop",
			"message": map[string]string{"role": "assistant", "content": p.greeting + ", " + string(body)}}}})
}

// A provider type built in with xcaddy: configured in the Caddyfile like
// the built-in ones (its own options too), adapted to JSON, and routed to.
func TestThirdPartyProviderType(t *testing.T) {
	var seen *http.Request
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r
		_, _ = w.Write([]byte("pong"))
	}))
	defer upstream.Close()

	var h Handler
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`llm_router {
		provider e {
			greeting hello
			type echo_test
			base_url ` + upstream.URL + `
			api_key echo-key
		}
		model m {
			deployment e up-model
		}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(h.ProvidersRaw["e"], &cfg); err != nil || cfg["type"] != "echo_test" || cfg["greeting"] != "hello" ||
		cfg["base_url"] != upstream.URL {
		t.Fatalf("expected the type's JSON with its own option, got %s", h.ProvidersRaw["e"])
	}
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()

	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"ping"}]}`))
	if err := h.ServeHTTP(w, r, nil); err != nil {
		t.Fatal(err)
	}
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"content":"hello, pong"`) || w.Header().Get(HeaderDeployment) != "e/up-model" {
		t.Errorf("expected the echo type's answer, got %d %s", w.Code, w.Body)
	}
	if seen == nil || seen.URL.Path != "/echo/up-model" || seen.Header.Get("X-Echo-Key") != "echo-key" {
		t.Errorf("expected the type's own request, got %+v", seen)
	}
	// Not served: the type does not take Messages.
	w = httptest.NewRecorder()
	r = httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"ping"}]}`))
	_ = h.ServeHTTP(w, r, nil)
	if w.Code != 400 || !strings.Contains(w.Body.String(), "has no deployment that serves messages") {
		t.Errorf("expected a 400 for a format the group does not serve, got %d %s", w.Code, w.Body)
	}

	for input, want := range map[string]string{
		`provider e {
			type echo_test
			base_url http://h
			colour red
		}`: "unknown subdirective colour in provider",
		`provider e {
			type palm
			base_url http://h
		}`: `unknown provider type "palm" (known: anthropic, azure, echo_test, gemini, openai)`,
		`provider e {
			type echo_test
			type openai
			base_url http://h
		}`: "duplicate subdirective type in provider",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_router {\n" + input + "\nmodel m {\ndeployment e x\n}\n}"))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "Testfile:") {
			t.Errorf("expected an error with a position containing %q, got %v", want, err)
		}
	}
}
