package llmrouter

import (
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

// Plan sends the request's Chat form, with the upstream model, to
// <base_url>/echo/<model>, the key in X-Echo-Key.
func (e *echoType) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	body, err := r.Chat()
	if err != nil {
		return nil, err
	}
	if body, err = provider.SetModel(body, model); err != nil {
		return nil, err
	}
	ep := e.ProviderEndpoint()
	name, prefix := e.KeyHeader()
	req, err := ep.NewRequest(ctx, ep.BaseURL+"/echo/"+model, body, r.Stream, name, prefix)
	if err != nil {
		return nil, err
	}
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

func (p echoPlan) Request() *http.Request { return p.req }
func (echoPlan) Format() provider.Format  { return provider.Chat }
func (echoPlan) Native() bool             { return false }

// Stream reads the echo's stream: each event's data is a word, sent on as
// a chat.completion.chunk; "END" finishes the answer.
func (p echoPlan) Stream(body io.Reader) provider.Stream {
	return provider.SSE(body, &echoStream{greeting: p.greeting})
}

type echoStream struct {
	greeting string
	done     bool
}

func (s *echoStream) Decode(ev *provider.Event) (provider.Event, provider.EventKind, provider.Observation) {
	if string(ev.Data) == "END" {
		s.done = true
		return provider.Event{}, provider.EventDone, provider.Observation{}
	}
	chunk, _ := json.Marshal(map[string]any{"object": "chat.completion.chunk", "model": "echo",
		"choices": []map[string]any{{"index": 0, "delta": map[string]string{"content": s.greeting + " " + string(ev.Data)}}}})
	return provider.Event{Data: chunk}, provider.EventData, provider.Observation{}
}

func (s *echoStream) Complete() bool { return s.done }

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
	var sent []byte
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r
		sent, _ = io.ReadAll(r.Body)
		if r.Header.Get("Accept") == "text/event-stream" {
			_, _ = w.Write([]byte("data: one\n\ndata: two\n\ndata: END\n\n"))
			return
		}
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
	r := postJSON("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"ping"}]}`)
	if err := h.ServeHTTP(w, r, nil); err != nil {
		t.Fatal(err)
	}
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"content":"hello, pong"`) || w.Header().Get(HeaderDeployment) != "e/up-model" {
		t.Errorf("expected the echo type's answer, got %d %s", w.Code, w.Body)
	}
	if seen == nil || seen.URL.Path != "/echo/up-model" || seen.Header.Get("X-Echo-Key") != "echo-key" ||
		!strings.Contains(string(sent), `"model":"up-model"`) {
		t.Errorf("expected the type's own request with the upstream model, got %+v %s", seen, sent)
	}
	// Streamed, through the type's decoder, to a Messages client (translated).
	w = httptest.NewRecorder()
	r = postJSON("/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"ping"}]}`)
	if err := h.ServeHTTP(w, r, nil); err != nil {
		t.Fatal(err)
	}
	if b := w.Body.String(); w.Code != 200 || !strings.Contains(b, `"content":"hello one"`) || !strings.Contains(b, `"content":"hello two"`) ||
		!strings.HasSuffix(b, "data: [DONE]\n\n") {
		t.Errorf("expected the echo's stream, got %d %s", w.Code, b)
	}
	// Not served: the type does not take Messages.
	w = httptest.NewRecorder()
	r = postJSON("/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"ping"}]}`)
	_ = h.ServeHTTP(w, r, nil)
	if w.Code != 400 || !strings.Contains(w.Body.String(), "has no deployment that serves messages") {
		t.Errorf("expected a 400 for a format the group does not serve, got %d %s", w.Code, w.Body)
	}

	for input, want := range map[string]string{
		`provider e {
			type echo_test
			api_key none
			base_url http://h
			colour red
		}`: "unknown subdirective colour in provider",
		`provider e {
			type palm
			base_url http://h
		}`: `unknown provider type "palm" (known: anthropic, azure, bedrock, echo_test, gemini, openai, vertex)`,
		`provider e {
			type echo_test
			api_key none
			type openai
			api_key none
			base_url http://h
		}`: "duplicate subdirective type in provider",
		`provider e {
			base_url http://h
		}`: "provider e needs a type (anthropic, azure, bedrock, echo_test, gemini, openai, vertex), at Testfile:2",
		`provider f {
			type openai
			api_key none
			base_url http://h
		}`: "deployment names unknown provider e (configured: f), at Testfile:",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_router {\n" + input + "\nmodel m {\ndeployment e x\n}\n}"))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "Testfile:") {
			t.Errorf("expected an error with a position containing %q, got %v", want, err)
		}
	}
}

// An api_key is required unless a header carries the credentials or the
// config says `api_key none`; one that resolves to nothing at load is an
// error naming its placeholder, never a value.
func TestAPIKeyRequired(t *testing.T) {
	t.Setenv("LLM_ROUTER_TEST_SET", "sk-secret-value")
	for _, tc := range []struct {
		name, provider, want string
		key                  string // the key the endpoint holds, when it loads
	}{
		{"unset variable", `"api_key":"{env.LLM_ROUTER_TEST_UNSET}"`, "api_key {env.LLM_ROUTER_TEST_UNSET} is empty once its placeholders are replaced: is the environment variable set? (`api_key none` for a server that takes no key)", ""},
		{"blank variable", `"api_key":"{env.LLM_ROUTER_TEST_BLANK}"`, "api_key {env.LLM_ROUTER_TEST_BLANK} is empty", ""},
		{"missing", ``, "needs an api_key", ""},
		{"partly unset", `"api_key":"sk-{env.LLM_ROUTER_TEST_UNSET}"`, "api_key {env.LLM_ROUTER_TEST_UNSET} is empty once its placeholders are replaced", ""},
		{"set and unset", `"api_key":"{env.LLM_ROUTER_TEST_SET}{env.LLM_ROUTER_TEST_UNSET}"`, "api_key {env.LLM_ROUTER_TEST_UNSET} is empty", ""},
		{"unset credential header", `"headers":{"Authorization":["Bearer {env.LLM_ROUTER_TEST_UNSET}"]}`, "header Authorization {env.LLM_ROUTER_TEST_UNSET} is empty once its placeholders are replaced", ""},
		{"none", `"api_key":"none"`, "", ""},
		{"NONE", `"api_key":" NONE "`, "", ""},
		{"a key from a file", `"api_key":"{env.LLM_ROUTER_TEST_FILE_KEY}"`, "", "sk-from-a-file"},
		{"set variable", `"api_key":"{env.LLM_ROUTER_TEST_SET}"`, "", "sk-secret-value"},
		{"credential header", `"headers":{"Api-Key":["{env.LLM_ROUTER_TEST_SET}"]}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("LLM_ROUTER_TEST_BLANK", "  ")
			t.Setenv("LLM_ROUTER_TEST_FILE_KEY", "sk-from-a-file\n")
			fields := `"type":"openai","base_url":"http://127.0.0.1:1/v1"`
			if tc.provider != "" {
				fields += "," + tc.provider
			}
			h := handlerFromJSON(t, `{"providers":{"a":{`+fields+`}},"models":{"m":{"deployments":[{"provider":"a","model":"x"}]}}}`)
			err := h.Provision(newCaddyContext(t))
			defer h.Cleanup()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("expected the config to load, got %v", err)
				}
				if got := h.providers["a"].ProviderSettings().endpoint.APIKey; got != tc.key {
					t.Errorf("expected the key %q, got %q", tc.key, got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("expected an error containing %q, got %v", tc.want, err)
			}
			if strings.Contains(err.Error(), "sk-secret-value") {
				t.Errorf("the error shows a key: %v", err)
			}
		})
	}
}

// An openai provider's continuation: declared, or known from its
// base_url's host (Mistral; DeepSeek's beta endpoint), else none.
func TestOpenAIContinuation(t *testing.T) {
	for _, tc := range []struct {
		base, declared string
		want           provider.Continuation
	}{
		{"https://api.openai.com/v1", "", provider.NoContinuation},
		{"https://api.mistral.ai/v1", "", provider.PrefixFlag},
		{"https://API.Mistral.ai/v1", "", provider.PrefixFlag},
		{"https://api.deepseek.com/beta", "", provider.PrefixFlag},
		{"https://api.deepseek.com/v1", "", provider.NoContinuation},
		{"http://vllm:8000/v1", "continue_final_message", provider.ContinueFinalMessage},
		{"http://llama:8080/v1", "prefill", provider.Prefill},
		{"https://api.mistral.ai/v1", "none", provider.NoContinuation},
	} {
		p := &OpenAI{ProviderConfig: ProviderConfig{BaseURL: tc.base, APIKey: "none"}, Continuation: tc.declared}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := p.Provision(ctx)
		cancel()
		if err != nil || p.OpenAI.Continuation != tc.want {
			t.Errorf("%s %q: expected %s, got %s (%v)", tc.base, tc.declared, tc.want, p.OpenAI.Continuation, err)
		}
	}
	p := &OpenAI{ProviderConfig: ProviderConfig{BaseURL: "http://h/v1", APIKey: "none"}, Continuation: "sometimes"}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := p.Provision(ctx); err == nil || !strings.Contains(err.Error(), "continuation") {
		t.Errorf("expected an unknown continuation refused, got %v", err)
	}
}
