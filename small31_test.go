package llmrouter

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// A consumer's 429 lets the official SDKs retry it after its Retry-After
// when that wait is known and short enough for them to sleep (concurrent:
// the expected end of a request in flight; rpm: the minute's next free
// second), and says x-should-retry: false when it is not (a budget that
// renews in an hour: openai-node would not sleep it but retry at once,
// twice, with its own backoff).
func TestConsumer429sSayWhetherTheSDKsShouldRetry(t *testing.T) {
	u := newSeenUpstream(t)
	h, clock := consumersHandler(t, u, `"consumer": "{http.request.header.X-Team}",
		"plans": {"conc": {"concurrent": 1}, "rate": {"rpm": 1}, "spend": {"budget": {"usd": 0.001, "per": 3600000000000}}},
		"consumers": {"conc": ["c"], "rate": ["r"], "spend": ["s"]}`)
	team := func(name string) http.Header { return http.Header{"X-Team": {name}} }
	// r: its one request of the minute 20 s before; s: its budget spent.
	for _, who := range []string{"r", "s"} {
		if w, _, _ := askAs(h, "/v1/chat/completions", fastChat, team(who)); w.Code != 200 {
			t.Fatalf("%s: %d %s", who, w.Code, w.Body)
		}
	}
	clock.Advance(16 * time.Second)
	// c: one request took 4 s; the one in flight since 20 s is expected
	// to end in 4 s.
	first, e := h.admit(httptest.NewRecorder(), "c", h.groups["fast"], &router.Request{})
	if e != nil {
		t.Fatal(e)
	}
	clock.Advance(4 * time.Second)
	first.done(nil, 0)
	if _, e := h.admit(httptest.NewRecorder(), "c", h.groups["fast"], &router.Request{}); e != nil {
		t.Fatal(e)
	}
	for _, c := range []struct {
		who, limit, retryAfter, shouldRetry string
	}{
		{"c", "concurrent", "4", ""},
		{"r", "rpm", "40", ""},
		{"s", "budget", "3580", "false"}, // bgClock starts at 12:00; the hour renews at 13:00
	} {
		for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
			body := fastChat
			if path == "/v1/messages" {
				body = fastMessages
			}
			w, _, _ := askAs(h, path, body, team(c.who))
			if w.Code != 429 || w.Header().Get(HeaderConsumerLimit) != c.limit {
				t.Fatalf("%s %s: expected 429 %s, got %d %v %s", c.who, path, c.limit, w.Code, w.Header(), w.Body)
			}
			if got, retry := w.Header().Get("Retry-After"), w.Header().Get("X-Should-Retry"); got != c.retryAfter || retry != c.shouldRetry {
				t.Errorf("%s %s: expected Retry-After %s and x-should-retry %q, got %s and %q", c.limit, path, c.retryAfter, c.shouldRetry, got, retry)
			}
		}
	}
}

// A consumer on no plan (no `default` defined) is listed in GET
// /llm_router/consumers with its use and no limits, as is one on a plan
// of a weight alone; the anonymous consumer on no plan is not.
func TestConsumersOnNoPlanAreListed(t *testing.T) {
	u := newSeenUpstream(t)
	h, _ := consumersHandler(t, u, `"consumer": "{http.request.header.X-Team}",
		"plans": {"team-a": {"rpm": 100}, "heavy": {"weight": 3}}, "consumers": {"team-a": ["alice"], "heavy": ["hal"]}`)
	for _, who := range []string{"alice", "bob", "bob", "hal", ""} {
		if w, _, _ := askAs(h, "/v1/chat/completions", fastChat, http.Header{"X-Team": {who}}); w.Code != 200 {
			t.Fatalf("%q: expected 200, got %d %s", who, w.Code, w.Body)
		}
	}
	w := httptest.NewRecorder()
	if err := handleConsumers(w, httptest.NewRequest(http.MethodGet, "/llm_router/consumers", nil)); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Consumers []map[string]any `json:"consumers"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, w.Body)
	}
	want := []string{
		"map[consumer:alice in_flight:0 plan:team-a requests_last_minute:1 rpm:100 spent_usd:0 tokens_last_minute:%d weight:1]",
		"map[consumer:bob in_flight:0 plan: requests_last_minute:2 spent_usd:0 tokens_last_minute:%d weight:1]",
		"map[consumer:hal in_flight:0 plan:heavy requests_last_minute:1 spent_usd:0 tokens_last_minute:%d weight:3]",
	}
	if len(got.Consumers) != len(want) {
		t.Fatalf("expected alice, bob and hal, got %s", w.Body)
	}
	for i, c := range got.Consumers {
		tokens := c["tokens_last_minute"].(float64)
		if s := fmt.Sprint(c); s != fmt.Sprintf(want[i], int(tokens)) || tokens <= 0 {
			t.Errorf("expected %s, got %s", want[i], s)
		}
	}
}

// A follow-up on a stored response that the provider answers 200 with a
// body the client's SDK cannot read (empty: openai-node's retrieve gives
// undefined; HTML, a JSON array) is a 502 in OpenAI's format that says
// so, not the body as it came; a delete's empty 200 (the SDK reads
// nothing of it) is passed on.
func TestStoredResponseAnswersTheSDKCannotReadAre502(t *testing.T) {
	a, b := newBGAccount(t, "sk-bg-a", "fa"), newBGAccount(t, "sk-bg-b", "fb")
	var broken atomic.Pointer[string]
	serve := a.srv.Config.Handler
	a.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if body := broken.Load(); body != nil && r.Method != http.MethodPost || body != nil && strings.HasSuffix(r.URL.Path, "/cancel") {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(*body))
			return
		}
		serve.ServeHTTP(w, r)
	})
	h, _ := bgRouter(t, a, b, "")
	id := createBG(t, h, "ga")
	for _, body := range []string{"", "<html>ok</html>", "[]", `{"id":`} {
		broken.Store(&body)
		for _, f := range []struct{ method, path string }{
			{http.MethodGet, "/v1/responses/" + id},
			{http.MethodGet, "/v1/responses/" + id + "/input_items"},
			{http.MethodPost, "/v1/responses/" + id + "/cancel"},
		} {
			code, got, _ := call(t, h, f.method, f.path, "")
			var e struct {
				Error struct {
					Type, Message string
				}
			}
			if err := json.Unmarshal(got, &e); code != http.StatusBadGateway || err != nil || e.Error.Type != "server_error" ||
				!strings.Contains(e.Error.Message, "deployment a/gpt-x answered 200 with") {
				t.Errorf("%s %s answered %q: expected a 502 server_error that says so, got %d %s", f.method, f.path, body, code, got)
			}
		}
	}
	empty := ""
	broken.Store(&empty)
	if code, got, _ := call(t, h, http.MethodDelete, "/v1/responses/"+id, ""); code != 200 || len(got) != 0 {
		t.Errorf("a delete's empty 200: expected it passed on, got %d %s", code, got)
	}
}

// countsApartAccount is an Anthropic account whose token counting has its
// own limit (docs.anthropic.com, "Token counting"): its counts are
// answered 429 with retry-after 20 until open is set, then 200; its Messages requests
// are answered 200 with a window of one request per 30 s of clock, the
// first one spending it.
type countsApartAccount struct {
	*httptest.Server
	counts, messages atomic.Int32
	open             atomic.Bool
}

func newCountsApartAccount(t *testing.T, clock *bgClock) *countsApartAccount {
	a := &countsApartAccount{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/messages/count_tokens" {
			if a.counts.Add(1); !a.open.Load() {
				w.Header().Set("retry-after", "20")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = w.Write([]byte(`{"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests has exceeded your per-minute rate limit for token counting."}}`))
				return
			}
			_, _ = w.Write([]byte(`{"input_tokens":7}`))
			return
		}
		a.messages.Add(1)
		w.Header().Set("anthropic-ratelimit-requests-limit", "1")
		w.Header().Set("anthropic-ratelimit-requests-remaining", "0")
		w.Header().Set("anthropic-ratelimit-requests-reset", clock.Now().Add(30*time.Second).UTC().Format(time.RFC3339))
		_, _ = w.Write([]byte(`{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":2}}`))
	}))
	t.Cleanup(a.Close)
	return a
}

const (
	soloMessages = `{"model":"solo","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	soloCount    = `{"model":"solo","messages":[{"role":"user","content":"Count these words."}]}`
)

// ask sends one request to h.
func ask(h *Handler, path, body string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	_ = h.ServeHTTP(w, postJSON(path, body), nil)
	return w
}

// Counts of tokens that wait for their own limit (the count's 429 and
// retry-after 20) are forecast from that limit, not from the Messages
// window of their deployment (rpm 1, spent): four of them
// all wait, none is told 429 at once, and each is answered by the provider
// once the count's limit is back, 20 s later, well within the deadline.
// (The first count, refused until its deadline, is answered with an
// estimate.)
func TestWaitingCountsAreForecastFromTheirOwnLimit(t *testing.T) {
	clock := newBGClock()
	acct := newCountsApartAccount(t, clock)
	h := handlerFromCaddyfile(t, `llm_router {
		provider a {
			type anthropic
			base_url `+acct.URL+`/v1
			api_key sk-ant-a
		}
		model solo {
			deployment a claude-x {
				rpm 1
			}
		}
	}`)
	defer h.Cleanup()
	h.router.Clock = clock
	ask(h, "/v1/messages/count_tokens", soloCount) // its 429s cool the counts for 20 s (answered with an estimate)
	if w := ask(h, "/v1/messages", soloMessages); w.Code != 200 {
		t.Fatalf("the Messages request: %d %s", w.Code, w.Body)
	}
	h.router.Clock = heldClock{clock}
	g := h.groups["solo"]
	answers := make(chan *httptest.ResponseRecorder, 4)
	for range 4 {
		go func() { answers <- ask(h, "/v1/messages/count_tokens", soloCount) }()
	}
	for i := 0; g.Queued() < 4; i++ {
		select {
		case w := <-answers:
			t.Fatalf("a count was answered (an estimate: its 429) before its limit was back: %d %s", w.Code, w.Body)
		case <-time.After(10 * time.Millisecond):
		}
		if i == 500 {
			t.Fatalf("the counts did not wait (queued %d)", g.Queued())
		}
	}
	before := acct.counts.Load()
	acct.open.Store(true)
	clock.Advance(21 * time.Second)
	for range 4 {
		if w := <-answers; w.Code != 200 {
			t.Errorf("a count after its limit was back: expected 200, got %d %s", w.Code, w.Body)
		}
	}
	if n := acct.counts.Load() - before; n != 4 {
		t.Errorf("expected the provider asked the 4 counts that waited, got %d", n)
	}
}

// A Messages request's tier is chosen by its own place in the queue:
// counts of tokens waiting for their own limit before it (10) are no demand on
// the first tier's Messages window (rpm 2, spent; back in 60 s, within the
// 120 s deadline), so the request waits for the first tier, as the tiers
// promise, and the second tier is never asked.
func TestWaitingCountsDoNotPushMessagesToAHigherTier(t *testing.T) {
	clock := newBGClock()
	acct := newCountsApartAccount(t, clock)
	up := newSeenUpstream(t)
	h := handlerFromCaddyfile(t, `llm_router {
		deadline 120s
		provider a {
			type anthropic
			base_url `+acct.URL+`/v1
			api_key sk-ant-a
		}
		provider b {
			type openai
			base_url `+up.URL+`/v1
			api_key sk-b
		}
		model solo {
			deployment a claude-x {
				rpm 2
			}
			deployment b gpt-x {
				tier 2
			}
		}
	}`)
	defer h.Cleanup()
	h.router.Clock = clock
	ask(h, "/v1/messages/count_tokens", soloCount) // its 429s cool the counts for 20 s (answered with an estimate)
	for range 2 {
		if w := ask(h, "/v1/messages", soloMessages); w.Code != 200 || w.Header().Get(HeaderDeployment) != "a/claude-x" {
			t.Fatalf("a Messages request: %d %v %s", w.Code, w.Header(), w.Body)
		}
	}
	h.router.Clock = heldClock{clock}
	g := h.groups["solo"]
	counts := make(chan *httptest.ResponseRecorder, 10)
	for range 10 {
		go func() { counts <- ask(h, "/v1/messages/count_tokens", soloCount) }()
	}
	for i := 0; g.Queued() < 10; i++ {
		if i == 500 {
			t.Fatalf("the counts did not wait (queued %d)", g.Queued())
		}
		time.Sleep(10 * time.Millisecond)
	}
	msg := make(chan *httptest.ResponseRecorder, 1)
	go func() { msg <- ask(h, "/v1/messages", soloMessages) }()
	select {
	case w := <-msg:
		t.Fatalf("the Messages request went on at once: %d %s from %s (the second tier asked %d times), though the first tier serves it in 60 s",
			w.Code, w.Body, w.Header().Get(HeaderDeployment), up.count())
	case <-time.After(time.Second):
	}
	acct.open.Store(true)
	clock.Advance(61 * time.Second)
	if w := <-msg; w.Code != 200 || w.Header().Get(HeaderDeployment) != "a/claude-x" {
		t.Errorf("the Messages request: expected 200 from the first tier, got %d from %q: %s", w.Code, w.Header().Get(HeaderDeployment), w.Body)
	}
	advanceUntil(t, clock, 61*time.Second, func() {
		for range 10 {
			<-counts
		}
	})
	if up.count() != 0 {
		t.Errorf("the second tier was asked %d times", up.count())
	}
}
