package llmrouter

import (
	"context"
	"encoding/json"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// modelUpstream is an OpenAI provider whose model "m1" is rate-limited
// for an hour (a 429 with Retry-After, as OpenAI sends it) and whose other
// models answer 200; it counts the requests of each model.
type modelUpstream struct {
	*httptest.Server
	mu sync.Mutex
	n  map[string]int
}

func newModelUpstream(t *testing.T) *modelUpstream {
	u := &modelUpstream{n: map[string]int{}}
	ok, err := os.ReadFile("testdata/openai-200.json")
	if err != nil {
		t.Fatal(err)
	}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model string `json:"model"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &body)
		u.mu.Lock()
		u.n[body.Model]++
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if body.Model == "m1" {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}`)
			return
		}
		_, _ = w.Write(ok)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *modelUpstream) count(model string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[model]
}

// A plan's groups bound the fallback groups too: a consumer that may use
// "fast" alone does not reach "smart" through fast's fallback_group; one
// whose plan allows both does.
func TestPlanGroupsBoundTheFallbackGroups(t *testing.T) {
	u := newModelUpstream(t)
	h := handlerFromJSON(t, `{
		"providers": {"oa": {"type": "openai", "base_url": "`+u.URL+`/v1", "api_key": "sk-provider-key"}},
		"models": {"fast": {"deployments": [{"provider": "oa", "model": "m1"}], "fallback_group": "smart"},
		           "smart": {"deployments": [{"provider": "oa", "model": "m2"}]}},
		"consumer": "{http.request.header.X-Team}",
		"plans": {"cheap": {"groups": ["fast"]}, "all": {"groups": ["fast", "smart"]}},
		"consumers": {"cheap": ["intern"], "all": ["lead"]}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	h.router.Clock = newBGClock()

	w, _, _ := askAs(h, "/v1/chat/completions", fastChat, http.Header{"X-Team": {"intern"}})
	if w.Code == http.StatusOK || u.count("m2") != 0 {
		t.Fatalf("intern (groups fast) was served by smart through fast's fallback_group: %d %s, m2 asked %d times", w.Code, w.Body, u.count("m2"))
	}
	if g := w.Header().Get(HeaderGroup); g == "smart" {
		t.Errorf("answer names group %s", g)
	}
	w, _, _ = askAs(h, "/v1/chat/completions", fastChat, http.Header{"X-Team": {"lead"}})
	if w.Code != http.StatusOK || u.count("m2") != 1 || w.Header().Get(HeaderGroup) != "smart" {
		t.Fatalf("lead (groups fast smart): expected smart's 200, got %d %s (group %q)", w.Code, strings.TrimSpace(w.Body.String()), w.Header().Get(HeaderGroup))
	}
}

// A config reload (Caddy provisions the new handler, then cleans up the
// old) keeps each consumer's use of its plan: the minute's requests and
// the budget window's spend, as it keeps the deployments' windows and the
// groups' budgets.
func TestReloadKeepsConsumersUse(t *testing.T) {
	u := newSeenUpstream(t)
	cfg := `"consumer": "{http.request.header.X-Team}",
		"plans": {"default": {"rpm": 1}, "rich": {"budget": {"usd": 0.001, "per": 3600000000000}}},
		"consumers": {"rich": ["bob"]}`
	old, _ := consumersHandler(t, u, cfg)
	for _, who := range []string{"alice", "bob"} {
		if w, _, _ := askAs(old, "/v1/chat/completions", fastChat, http.Header{"X-Team": {who}}); w.Code != 200 {
			t.Fatalf("%s: %d %s", who, w.Code, w.Body)
		}
	}
	reloaded, _ := consumersHandler(t, u, cfg)
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	for who, limit := range map[string]string{"alice": "rpm", "bob": "budget"} {
		w, _, _ := askAs(reloaded, "/v1/chat/completions", fastChat, http.Header{"X-Team": {who}})
		if w.Code != 429 || w.Header().Get(HeaderConsumerLimit) != limit {
			t.Errorf("%s after a reload: expected its %s's 429 still, got %d %s", who, limit, w.Code, w.Body)
		}
	}
	if u.count() != 2 {
		t.Errorf("expected 2 requests at the provider, got %d", u.count())
	}
}

// A consumer name that is no metrics label (invalid UTF-8, control
// characters, kilobytes long: what a header may carry) is answered as any
// and counted under "other": it neither panics the metrics nor grows
// their labels.
func TestConsumerNamesThatAreNoLabels(t *testing.T) {
	u := newSeenUpstream(t)
	h, _ := consumersHandler(t, u, `"consumer": "{http.request.header.X-Team}", "plans": {"default": {"rpm": 100}}`)
	m := getMetrics().consumers
	for _, name := range []string{"\xff\xfeteam", "team\x01\x7f", strings.Repeat("t", 4096)} {
		other0 := counterValue(m.requests.WithLabelValues(consumerOther, "200"))
		w, _, _ := askAs(h, "/v1/chat/completions", fastChat, http.Header{"X-Team": {name}})
		if w.Code != http.StatusOK {
			t.Errorf("%.20q: expected 200, got %d %s", name, w.Code, w.Body)
		}
		if d := counterValue(m.requests.WithLabelValues(consumerOther, "200")) - other0; d != 1 {
			t.Errorf("%.20q: expected llm_router_consumer_requests_total{other, 200} +1, got %+v", name, d)
		}
	}
}

// A background response's cost is spent on its consumer's budget when
// the router finds it done (its poll, or a client's), as it is on the
// deployment's: past the budget, the consumer's next request is a 429.
func TestBackgroundCostSpendsTheConsumersBudget(t *testing.T) {
	a := newBGAccount(t, "sk-bg-a", "ca")
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`llm_router {
		consumer {http.request.header.X-Team}
		plan default {
			budget 0.01 per 24h
		}
		provider a {
			type openai
			base_url ` + a.srv.URL + `/v1
			api_key ` + a.key + `
			responses native
		}
		model ga {
			deployment a gpt-x {
				cost_input 1000
				cost_output 1000
			}
		}
	}`)); err != nil {
		t.Fatal(err)
	}
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	clock := newBGClock()
	h.router.Clock = clock
	id := createBG(t, &h, "ga")
	a.finish(id)
	clock.Advance(BackgroundPollFirst) // the router's poll finds it done: 36 input tokens at 1000 USD per 1M
	if n, _ := answers(&h, "ga"); n != 1 {
		t.Fatalf("expected the router's poll to count the answer, got %d answers", n)
	}
	code, body, hdr := call(t, &h, http.MethodPost, "/v1/responses", `{"model":"ga","input":"hi","background":true}`)
	if code != http.StatusTooManyRequests || hdr.Get(HeaderConsumerLimit) != "budget" {
		t.Errorf("a background response spent 0.036 USD of a 0.01 budget: expected the next request's 429 budget, got %d %s", code, body)
	}
}

// count_tokens is not counted against a plan (docs/consumers.md): a
// consumer at its rpm may still count its prompt's tokens, and counting
// does not spend its rpm; a group outside its plan is still a 403.
func TestCountTokensIsNotCountedAgainstThePlan(t *testing.T) {
	u := newSeenUpstream(t)
	h, _ := consumersHandler(t, u, `"consumer": "{http.request.header.X-Team}", "plans": {"default": {"rpm": 1, "groups": ["fast"]}}`)
	team := http.Header{"X-Team": {"a"}, "Anthropic-Version": {"2023-06-01"}}
	count := `{"model":"fast","messages":[{"role":"user","content":"hi"}]}`
	for i := range 3 {
		if w, _, _ := askAs(h, "/v1/messages/count_tokens", count, team); w.Code != http.StatusOK {
			t.Fatalf("count %d: %d %s", i, w.Code, w.Body)
		}
	}
	if w, _, _ := askAs(h, "/v1/chat/completions", fastChat, team); w.Code != http.StatusOK {
		t.Errorf("after 3 counts, the consumer's one request a minute: expected 200, got %d %s", w.Code, w.Body)
	}
	if w, _, _ := askAs(h, "/v1/messages/count_tokens", count, team); w.Code != http.StatusOK {
		t.Errorf("a count at its rpm: expected 200, got %d %s", w.Code, w.Body)
	}
	if w, _, _ := askAs(h, "/v1/messages/count_tokens", strings.Replace(count, "fast", "smart", 1), team); w.Code != http.StatusForbidden {
		t.Errorf("a count for a group outside the plan: expected 403, got %d %s", w.Code, w.Body)
	}
}

// A stream the client abandons mid-way gives back its consumer's
// concurrent slot: the consumer's next request is admitted.
func TestAbandonedStreamFreesItsConcurrentSlot(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = rw.Write([]byte(chunk("Alpha", "")))
		rw.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer up.Close()
	defer close(release)
	h := handlerFromJSON(t, `{
		"providers": {"oa": {"type": "openai", "base_url": "`+up.URL+`/v1", "api_key": "sk-provider-key"}},
		"models": {"fast": {"deployments": [{"provider": "oa", "model": "m1"}]}},
		"plans": {"default": {"concurrent": 1}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	w := &flushRecorder{header: http.Header{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := postJSON("/v1/chat/completions", `{"model":"fast","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		_ = h.ServeHTTP(w, r.WithContext(ctx), nil)
	}()
	for deadline := time.Now().Add(5 * time.Second); !w.sent("Alpha"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream's first event never reached the client")
		}
	}
	r := httptest.NewRecorder()
	_ = h.ServeHTTP(r, postJSON("/v1/chat/completions", fastChat), nil)
	if r.Code != http.StatusTooManyRequests || r.Header().Get(HeaderConsumerLimit) != "concurrent" {
		t.Fatalf("a second request while the stream is open: expected 429 concurrent, got %d %s", r.Code, r.Body)
	}
	cancel() // the client goes away mid-stream
	<-done
	r = httptest.NewRecorder()
	_ = h.ServeHTTP(r, postJSON("/v1/chat/completions", `{"model":"fast","stream":true,"messages":[{"role":"user","content":"hi"}]}`).WithContext(ctxTimeout(t)), nil)
	if r.Code == http.StatusTooManyRequests {
		t.Errorf("after the client abandoned its stream: expected its slot back, got %d %s", r.Code, r.Body)
	}
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

// A 401 of a path no client API takes (GET /v1/models, a pass_through
// path) is in the format of the client that asks: Anthropic's for one
// that sends anthropic-version (its SDKs' models.list), else OpenAI's.
func TestKeys401OfOtherPathsIsInTheClientsFormat(t *testing.T) {
	u := newSeenUpstream(t)
	path := t.TempDir() + "/llm-keys"
	if err := os.WriteFile(path, []byte("alice "+sha("sk-client-alice")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h, _ := consumersHandler(t, u, `"keys": "`+path+`"`)
	for _, c := range []struct {
		header  http.Header
		typ     string
		outside bool // the error's type is at the top level's error object
	}{
		{http.Header{"Anthropic-Version": {"2023-06-01"}, "X-Api-Key": {"sk-wrong"}}, "authentication_error", true},
		{http.Header{"Authorization": {"Bearer sk-wrong"}}, "invalid_request_error", false},
	} {
		r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
		for k, v := range c.header {
			r.Header[k] = v
		}
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, r, nil)
		var m struct {
			Type  string `json:"type"`
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		_ = json.Unmarshal(w.Body.Bytes(), &m)
		if w.Code != http.StatusUnauthorized || m.Error.Type != c.typ || (m.Type == "error") != c.outside {
			t.Errorf("GET /v1/models with %v: expected 401 %s, got %d %s", c.header, c.typ, w.Code, w.Body)
		}
	}
}

// A client that sends a key both ways (the Anthropic SDKs send
// Authorization: Bearer for an auth token and x-api-key for an API key
// when both are set) is the consumer of the one the keys file knows, the
// Bearer's when both are known; neither reaches the provider.
func TestKeysInBothHeadersDisagreeing(t *testing.T) {
	u := newSeenUpstream(t)
	path := t.TempDir() + "/llm-keys"
	if err := os.WriteFile(path, []byte("alice "+sha("sk-client-alice")+"\nbob "+sha("sk-client-bob")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h, _ := consumersHandler(t, u, `"keys": "`+path+`"`)
	for _, c := range []struct {
		bearer, xAPIKey, want string
	}{
		{"sk-stale", "sk-client-alice", "alice"},
		{"sk-client-alice", "sk-stale", "alice"},
		{"sk-client-bob", "sk-client-alice", "bob"},
		{"sk-stale", "sk-other", ""},
	} {
		w, repl, _ := askAs(h, "/v1/messages", fastMessages, http.Header{"Authorization": {"Bearer " + c.bearer}, "X-Api-Key": {c.xAPIKey}, "Anthropic-Version": {"2023-06-01"}})
		got, _ := repl.GetString("http.llm_router.consumer")
		if c.want == "" && w.Code != http.StatusUnauthorized || c.want != "" && (w.Code != http.StatusOK || got != c.want) {
			t.Errorf("Bearer %s, x-api-key %s: expected consumer %q, got %d %q %s", c.bearer, c.xAPIKey, c.want, w.Code, got, w.Body)
		}
	}
	for _, a := range u.auths {
		if strings.Contains(a, "sk-client") || strings.Contains(a, "sk-stale") {
			t.Errorf("the client's key reached the provider: %q", a)
		}
	}
}
