package llmrouter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// seenUpstream is an OpenAI provider that answers every chat request 200
// with its usage, and keeps the credentials each request carried.
type seenUpstream struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string // Authorization and x-api-key of each request
	n     int
}

func newSeenUpstream(t *testing.T) *seenUpstream {
	u := &seenUpstream{}
	body, err := os.ReadFile("testdata/openai-200.json")
	if err != nil {
		t.Fatal(err)
	}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.n++
		u.auths = append(u.auths, r.Header.Get("Authorization")+"|"+r.Header.Get("X-Api-Key"))
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *seenUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n
}

func sha(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// consumersHandler provisions a router of group "fast" (and "smart") on u
// with the consumer settings in extra (JSON members), on a manual clock.
func consumersHandler(t *testing.T, u *seenUpstream, extra string) (*Handler, *bgClock) {
	t.Helper()
	h := handlerFromJSON(t, `{
		"providers": {"oa": {"type": "openai", "base_url": "`+u.URL+`/v1", "api_key": "sk-provider-key"}},
		"models": {"fast": {"deployments": [{"provider": "oa", "model": "m1", "cost_input": 1000, "cost_output": 1000}]},
		           "smart": {"deployments": [{"provider": "oa", "model": "m2"}]}},
		`+extra+`}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	clock := newBGClock()
	h.router.Clock = clock
	return h, clock
}

// askAs sends a client's request with headers through h, with Caddy's
// replacer and access log fields in its context as Caddy gives them.
func askAs(h *Handler, path, body string, header http.Header) (*httptest.ResponseRecorder, *caddy.Replacer, *caddyhttp.ExtraLogFields) {
	r := postJSON(path, body)
	for k, v := range header {
		r.Header[k] = v
	}
	repl := caddyhttp.NewTestReplacer(r) // the http.request.* placeholders
	extra := new(caddyhttp.ExtraLogFields)
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.ExtraLogFieldsCtxKey, extra))
	w := httptest.NewRecorder()
	_ = h.ServeHTTP(w, r, nil)
	return w, repl, extra
}

const fastChat = `{"model":"fast","messages":[{"role":"user","content":"hi"}]}`
const fastMessages = `{"model":"fast","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`

func errorOf(t *testing.T, w *httptest.ResponseRecorder) (typ, code, msg string) {
	t.Helper()
	var m struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("%v: %s", err, w.Body)
	}
	return m.Error.Type, m.Error.Code, m.Error.Message
}

// With keys, the key decides the consumer: none or an unknown one is a
// 401 in the client's format, and the client's key never reaches the
// provider (the provider's own does).
func TestKeysDecideTheConsumerAndNeverReachTheProvider(t *testing.T) {
	u := newSeenUpstream(t)
	path := filepath.Join(t.TempDir(), "llm-keys")
	if err := os.WriteFile(path, []byte("alice "+sha("sk-client-alice")+"\nbob "+sha("sk-client-bob")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h, _ := consumersHandler(t, u, `"keys": "`+path+`"`)
	core, logs := observer.New(zapcore.DebugLevel)
	h.logger, h.router.Logger = zap.New(core), zap.New(core)
	for _, c := range []struct {
		name, path, body string
		header           http.Header
		typ, code        string
	}{
		{"no key", "/v1/chat/completions", fastChat, nil, "invalid_request_error", "invalid_api_key"},
		{"unknown bearer", "/v1/chat/completions", fastChat, http.Header{"Authorization": {"Bearer sk-client-mallory"}}, "invalid_request_error", "invalid_api_key"},
		{"unknown x-api-key", "/v1/messages", fastMessages, http.Header{"X-Api-Key": {"sk-client-mallory"}}, "authentication_error", ""},
	} {
		w, _, _ := askAs(h, c.path, c.body, c.header)
		typ, code, msg := errorOf(t, w)
		if w.Code != 401 || typ != c.typ || code != c.code || strings.Contains(w.Body.String(), "mallory") {
			t.Errorf("%s: expected 401 %s %s, got %d %s %s %q", c.name, c.typ, c.code, w.Code, typ, code, msg)
		}
	}
	if u.count() != 0 {
		t.Fatalf("refused requests reached the provider: %d", u.count())
	}
	w, repl, extra := askAs(h, "/v1/chat/completions", fastChat, http.Header{"Authorization": {"Bearer sk-client-alice"}})
	if w.Code != 200 {
		t.Fatalf("alice's key: expected 200, got %d %s", w.Code, w.Body)
	}
	w, _, _ = askAs(h, "/v1/messages", fastMessages, http.Header{"X-Api-Key": {"sk-client-bob"}})
	if w.Code != 200 {
		t.Fatalf("bob's x-api-key: expected 200, got %d %s", w.Code, w.Body)
	}
	for _, a := range u.auths {
		if strings.Contains(a, "sk-client") || a != "Bearer sk-provider-key|" {
			t.Errorf("the provider got %q, expected only its own key", a)
		}
	}
	if v, _ := repl.Get("http.llm_router.consumer"); v != "alice" {
		t.Errorf("expected {http.llm_router.consumer} alice, got %v", v)
	}
	if entry := accessLogEntry(t, extra); entry["consumer"] != "alice" || entry["llm_deployment"] != "oa/m1" {
		t.Errorf("the access log entry: expected consumer alice beside the served fields, got %v", entry)
	}
	if n := logFieldCount(extra); n != 1 {
		t.Errorf("expected the router's one access log field (served's, inline), got %d: each Set drops Caddy's handler cache", n)
	}
	if logs.Len() == 0 {
		t.Fatal("nothing was logged at debug level: the check below would prove nothing")
	}
	for _, e := range logs.All() {
		if line := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(line, "sk-client") {
			t.Errorf("a client's key was logged: %s", line)
		}
	}
}

// A consumer over its plan's rpm gets a 429 in its client's format with
// the real Retry-After (when the minute frees a request) and
// X-LLM-Router-Limit: consumer; another consumer of the plan is not
// limited by it; the refused requests reach no provider.
func TestConsumerOverItsRPMGets429WithRetryAfter(t *testing.T) {
	u := newSeenUpstream(t)
	h, clock := consumersHandler(t, u, `"consumer": "{http.request.header.X-Team}", "plans": {"default": {"rpm": 2}}`)
	team := func(name string) http.Header { return http.Header{"X-Team": {name}} }
	m := getMetrics().consumers
	limited0, ok0 := counterValue(m.limited.WithLabelValues("a", "rpm")), counterValue(m.requests.WithLabelValues("a", "200"))
	input0 := counterValue(m.tokens.WithLabelValues("a", "input"))
	for i := range 2 {
		if w, _, _ := askAs(h, "/v1/chat/completions", fastChat, team("a")); w.Code != 200 {
			t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
		}
		clock.Advance(10 * time.Second)
	}
	// At 20 s: the first request leaves the minute at 60 s.
	w, _, _ := askAs(h, "/v1/chat/completions", fastChat, team("a"))
	typ, code, msg := errorOf(t, w)
	if w.Code != 429 || typ != "rate_limit_error" || code != "rate_limit_exceeded" || w.Header().Get("Retry-After") != "40" ||
		w.Header().Get(HeaderLimit) != "consumer" || w.Header().Get(HeaderConsumerLimit) != "rpm" || !strings.Contains(msg, "consumer a is over its rpm") {
		t.Errorf("expected 429 rpm, Retry-After 40, X-LLM-Router-Limit consumer, got %d %v %s", w.Code, w.Header(), w.Body)
	}
	w, _, _ = askAs(h, "/v1/messages", fastMessages, team("a"))
	if typ, _, _ := errorOf(t, w); w.Code != 429 || typ != "rate_limit_error" || w.Header().Get("Retry-After") != "40" {
		t.Errorf("Messages client: expected 429 rate_limit_error, got %d %s", w.Code, w.Body)
	}
	if w, _, _ := askAs(h, "/v1/chat/completions", fastChat, team("b")); w.Code != 200 {
		t.Errorf("team b: expected 200, got %d %s", w.Code, w.Body)
	}
	if u.count() != 3 {
		t.Errorf("expected 3 requests at the provider, got %d", u.count())
	}
	// testdata/openai-200.json's usage: 9 input tokens an answer.
	if d := counterValue(m.limited.WithLabelValues("a", "rpm")) - limited0; d != 2 {
		t.Errorf("expected llm_router_consumer_limited_total{a, rpm} +2, got %+v", d)
	}
	if d := counterValue(m.requests.WithLabelValues("a", "200")) - ok0; d != 2 {
		t.Errorf("expected llm_router_consumer_requests_total{a, 200} +2, got %+v", d)
	}
	if d := counterValue(m.tokens.WithLabelValues("a", "input")) - input0; d != 18 {
		t.Errorf("expected llm_router_consumer_tokens_total{a, input} +18, got %+v", d)
	}
	clock.Advance(40 * time.Second)
	if w, _, _ := askAs(h, "/v1/chat/completions", fastChat, team("a")); w.Code != 200 {
		t.Errorf("after Retry-After: expected 200, got %d %s", w.Code, w.Body)
	}
}

// A model group outside the consumer's plan is a 403 in the client's
// format; the budget, once spent, a 429 until the window renews.
func TestConsumerPlanGroupsAndBudget(t *testing.T) {
	u := newSeenUpstream(t)
	h, clock := consumersHandler(t, u, `"consumer": "{http.request.header.X-Team}",
		"plans": {"team-a": {"groups": ["fast"], "budget": {"usd": 0.001, "per": 3600000000000}}},
		"consumers": {"team-a": ["alice"]}`)
	alice := http.Header{"X-Team": {"alice"}}
	w, _, _ := askAs(h, "/v1/chat/completions", strings.Replace(fastChat, "fast", "smart", 1), alice)
	if typ, code, msg := errorOf(t, w); w.Code != 403 || typ != "invalid_request_error" || code != "permission_denied" || !strings.Contains(msg, "may not use model smart") {
		t.Errorf("expected 403 permission_denied, got %d %s", w.Code, w.Body)
	}
	w, _, _ = askAs(h, "/v1/messages", strings.Replace(fastMessages, "fast", "smart", 1), alice)
	if typ, _, _ := errorOf(t, w); w.Code != 403 || typ != "permission_error" {
		t.Errorf("Messages client: expected 403 permission_error, got %d %s", w.Code, w.Body)
	}
	// The answer's usage (testdata/openai-200.json) at 1000 USD per 1M
	// tokens costs more than the budget: the next request is refused
	// until the next hour.
	if w, _, _ := askAs(h, "/v1/chat/completions", fastChat, alice); w.Code != 200 {
		t.Fatalf("expected 200, got %d %s", w.Code, w.Body)
	}
	w, _, _ = askAs(h, "/v1/chat/completions", fastChat, alice)
	if w.Code != 429 || w.Header().Get(HeaderConsumerLimit) != "budget" || w.Header().Get("Retry-After") != "3600" {
		t.Errorf("expected 429 budget with Retry-After 3600 (bgClock is at 12:00), got %d %v %s", w.Code, w.Header(), w.Body)
	}
	clock.Advance(time.Hour)
	if w, _, _ := askAs(h, "/v1/chat/completions", fastChat, alice); w.Code != 200 {
		t.Errorf("the next hour: expected 200, got %d %s", w.Code, w.Body)
	}
	if u.count() != 2 {
		t.Errorf("expected 2 requests at the provider, got %d", u.count())
	}
}

// Bad consumer settings are refused at load.
func TestConsumerSettingsErrors(t *testing.T) {
	for _, c := range []struct{ extra, want string }{
		{`"consumer": "alice"`, "is not a placeholder"},
		{`"consumer": "{http.auth.user.id"`, "unbalanced braces"},
		{`"plans": {"p": {"rpm": -1}}`, "must not be negative"},
		{`"plans": {"p": {"groups": ["nope"]}}`, `unknown model group "nope"`},
		{`"consumers": {"p": ["alice"]}`, `unknown plan "p"`},
		{`"plans": {"p": {}, "q": {}}, "consumers": {"p": ["alice"], "q": ["alice"]}`, "consumer alice is on two plans"},
		{`"keys": "/nonexistent/llm-keys"`, "keys:"},
	} {
		h := handlerFromJSON(t, `{"providers": {"oa": {"type": "openai", "base_url": "http://127.0.0.1:1/v1", "api_key": "k"}},
			"models": {"fast": {"deployments": [{"provider": "oa", "model": "m1"}]}}, `+c.extra+`}`)
		err := h.Provision(newCaddyContext(t))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: expected an error with %q, got %v", c.extra, c.want, err)
		}
		_ = h.Cleanup()
	}
}

// The syntax parses into the JSON settings; its errors name the
// file and line.
func TestConsumersCaddyfile(t *testing.T) {
	const base = `provider p {
		type openai
		api_key none
		base_url http://127.0.0.1:1/v1
	}
	model smart {
		deployment p x
	}
	model fast {
		deployment p y
	}
`
	var h Handler
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`llm_router {
	consumer {http.auth.user.id}
	keys /etc/caddy/llm-keys
	plan team-a {
		weight 3
		rpm 600
		tpm 200000
		concurrent 20
		budget 50 per 24h
		groups smart fast
	}
	plan default {
		rpm 60
	}
	consumers team-a alice bob
	consumers default carol
	` + base + `}`))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(h.Consumers)
	want := `{"consumer":"{http.auth.user.id}","keys":"/etc/caddy/llm-keys","plans":{"default":{"rpm":60},` +
		`"team-a":{"weight":3,"rpm":600,"tpm":200000,"concurrent":20,"budget":{"usd":50,"per":86400000000000},"groups":["smart","fast"]}},` +
		`"consumers":{"default":["carol"],"team-a":["alice","bob"]}}`
	if string(got) != want {
		t.Errorf("expected\n%s\ngot\n%s", want, got)
	}
	for _, c := range []struct{ in, want string }{
		{"consumer\n", "Testfile:2"},
		{"consumer {a} {b}\n", "Testfile:2"},
		{"consumer {a}\n consumer {b}\n", "duplicate subdirective consumer, at Testfile:3"},
		{"plan a {\n weight -1\n }\n", "weight must be 0 (the default, 1) or from 0.001 to 1000, got -1, at Testfile:4"},
		{"plan a {\n colour red\n }\n", "unknown subdirective colour in plan a"},
		{"plan a {\n budget 5\n }\n", "budget takes <USD> per <duration>"},
		{"plan a {\n }\n plan a {\n }\n", "duplicate plan a, at Testfile:4"},
		{"plan a {\n rpm 1\n rpm 2\n }\n", "duplicate subdirective rpm in plan a"},
		{"plan a {\n groups\n }\n", "Testfile:3"},
		{"plan a {\n weight 2000\n }\n", "or from 0.001 to 1000, got 2000"},
		{"consumers a\n", "consumers takes <plan> <consumer>..."},
		{"plan a {\n }\n plan b {\n }\n consumers a x\n consumers b x\n", "consumer x is on two plans: a and b, at Testfile:7"},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_router {\n " + c.in + base + "}"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: expected an error with %q, got %v", c.in, c.want, err)
		}
	}
}

// The admin API and the status page's JSON list each consumer's use of
// its plan; the metrics' consumer label is bounded.
func TestConsumersAreVisible(t *testing.T) {
	u := newSeenUpstream(t)
	h, _ := consumersHandler(t, u, `"consumer": "{http.request.header.X-Team}",
		"plans": {"team-a": {"weight": 3, "rpm": 100}}, "consumers": {"team-a": ["alice"]}`)
	if w, _, _ := askAs(h, "/v1/chat/completions", fastChat, http.Header{"X-Team": {"alice"}}); w.Code != 200 {
		t.Fatalf("expected 200, got %d %s", w.Code, w.Body)
	}
	w := httptest.NewRecorder()
	if err := handleConsumers(w, httptest.NewRequest(http.MethodGet, "/llm_router/consumers", nil)); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Consumers []struct {
			Consumer string  `json:"consumer"`
			Plan     string  `json:"plan"`
			Weight   float64 `json:"weight"`
			Requests int64   `json:"requests_last_minute"`
			RPM      int64   `json:"rpm"`
		} `json:"consumers"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, w.Body)
	}
	if len(got.Consumers) != 1 || got.Consumers[0].Consumer != "alice" || got.Consumers[0].Plan != "team-a" ||
		got.Consumers[0].Weight != 3 || got.Consumers[0].Requests != 1 || got.Consumers[0].RPM != 100 {
		t.Errorf("unexpected consumers %s", w.Body)
	}
	if rep := statusReport(time.Now()); len(rep.Consumers) != 1 {
		t.Errorf("the status report has no consumer: %+v", rep.Consumers)
	}
}

func TestConsumerLabelsAreBounded(t *testing.T) {
	l := newConsumerLabels([]string{"alice", "bob", "alice"})
	if l.of("alice") != "alice" || l.of("") != consumerAnonymous {
		t.Fatal("a named consumer or the anonymous one lost its label")
	}
	for i := range 2 * DefaultMaxConsumerLabels {
		l.of("c" + strconv.Itoa(i))
	}
	if got := l.of("late"); got != consumerOther {
		t.Errorf("expected the %d+1st consumer counted as %s, got %s", DefaultMaxConsumerLabels, consumerOther, got)
	}
	if l.of("c0") != "c0" || l.of("bob") != "bob" || len(l.seen) != DefaultMaxConsumerLabels {
		t.Errorf("expected %d labels, the first ones kept; got %d", DefaultMaxConsumerLabels, len(l.seen))
	}
}

// The plan's weight is the request's in the queue.
func TestAdmitGivesTheRequestItsConsumerAndWeight(t *testing.T) {
	u := newSeenUpstream(t)
	h, _ := consumersHandler(t, u, `"plans": {"team-a": {"weight": 3}}, "consumers": {"team-a": ["alice"]}`)
	for who, want := range map[string]float64{"alice": 3, "carol": 1, "": 1} {
		req := &router.Request{}
		if _, e := h.admit(httptest.NewRecorder(), who, h.groups["fast"], req); e != nil {
			t.Fatal(e)
		}
		if req.Consumer != who || req.Weight != want {
			t.Errorf("%q: expected weight %v, got %q %v", who, want, req.Consumer, req.Weight)
		}
	}
}

// counterValue is a counter's value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// With keys, the Responses API's WebSocket mode is identified at the
// upgrade (whose key is then removed): each turn is its consumer's, not a
// request without a key.
func TestWebSocketTurnsKeepTheUpgradesConsumer(t *testing.T) {
	a := &fakeResponses{text: "From a."}
	ua := httptest.NewServer(a)
	t.Cleanup(ua.Close)
	path := filepath.Join(t.TempDir(), "llm-keys")
	if err := os.WriteFile(path, []byte("alice "+sha("client-key")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := handlerFromJSON(t, `{"providers": {"a": {"type": "openai", "base_url": "`+ua.URL+`/v1", "api_key": "sk-a", "responses": "native"}},
		"models": {"m": {"deployments": [{"provider": "a", "model": "ma"}]}}, "keys": "`+path+`", "plans": {"default": {"rpm": 100}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = h.ServeHTTP(w, r, nil) }))
	t.Cleanup(srv.Close)
	c := wsDial(t, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/responses") // Bearer client-key
	for i := range 2 {
		evs := wsTurn(t, c, `{"type":"response.create","model":"m","store":false,"input":"hi"}`)
		if got := eventTypes(evs); len(got) != 3 || got[2] != "response.completed" {
			t.Errorf("turn %d: expected a's answer, got %v", i+1, evs)
		}
	}
	if u := h.Consumers.registry.Report(h.router.Clock.Now()); len(u) != 1 || u[0].Consumer != "alice" || u[0].Requests != 2 {
		t.Errorf("expected alice's two turns counted, got %+v", u)
	}
}
