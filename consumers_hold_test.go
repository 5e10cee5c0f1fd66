package llmrouter

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// heldUpstream is an OpenAI provider that holds every chat request until
// release is closed, then answers 200 with testdata/openai-200.json's
// usage (11 tokens); arrived counts the requests that reached it.
type heldUpstream struct {
	*httptest.Server
	release chan struct{}
	arrived atomic.Int32
	once    sync.Once
}

func newHeldUpstream(t *testing.T) *heldUpstream {
	body, err := os.ReadFile("testdata/openai-200.json")
	if err != nil {
		t.Fatal(err)
	}
	u := &heldUpstream{release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.arrived.Add(1)
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(u.Close)
	t.Cleanup(u.open) // before Close (cleanups run last first): a held request ends
	return u
}

// open releases the held requests (once).
func (u *heldUpstream) open() {
	u.once.Do(func() { close(u.release) })
}

// settledWithin waits (5 s at most, real time: the requests run on their
// own goroutines) until ok, and reports whether it came.
func settledWithin(ok func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ok() {
			return true
		}
	}
	return false
}

// A consumer's budget holds each admitted request's worst case (its
// prompt and max_tokens at the dearest deployment's prices) until its
// answer settles it at its real cost: 8 requests at once on a budget
// that holds 2 worst cases send 2 to the provider and refuse 6 with the
// consumer's budget 429; once the 2 are answered (a few cents), the
// budget admits again.
func TestConsumerBudgetHoldsRequestsInFlight(t *testing.T) {
	u := newHeldUpstream(t)
	budgetHoldsInFlight(t, u, []*Handler{heldBudgetHandler(t, u, "")})
}

// In fleet mode the consumer's budget holds each request's worst case
// fleet-wide, as one instance's does (it held the consumer's usual cost,
// a millionth of a USD before its first answer): two routers on one Redis,
// the 8 requests alternating between them, send 2 to the provider and
// refuse 6 (4 at the provider before: each router's own count admitted 2).
func TestConsumerBudgetHoldsRequestsInFlightAcrossTheFleet(t *testing.T) {
	m := miniredis.RunT(t)
	t.Setenv("LLM_ROUTER_TEST_REDIS", "redis://"+m.Addr())
	u := newHeldUpstream(t)
	hs := make([]*Handler, 2)
	for i := range hs {
		// Two stores (poll_interval differs, so the pool does not share one).
		hs[i] = heldBudgetHandler(t, u, fmt.Sprintf(`, "store": {"type": "redis", "url": "{env.LLM_ROUTER_TEST_REDIS}", "timeout": 2000000000, "poll_interval": %d}`, (i+1)*int(time.Second)))
	}
	if hs[0].store == hs[1].store {
		t.Fatal("expected two stores")
	}
	// Each its own counts, as two processes have (one process's routers
	// share theirs: consumerCounts).
	hs[1].Consumers.registry.ShareCounts(consumer.NewCounts())
	for _, h := range hs {
		if !settledWithin(func() bool { return h.store.Up() }) {
			t.Fatal("the fleet store is not up")
		}
	}
	budgetHoldsInFlight(t, u, hs)
}

// heldBudgetHandler is a router on u whose default plan's budget is 1.5
// USD per hour at 1000 USD per million tokens; extra is more of its JSON
// config (a store).
func heldBudgetHandler(t *testing.T, u *heldUpstream, extra string) *Handler {
	h := handlerFromJSON(t, `{
		"providers": {"oa": {"type": "openai", "base_url": "`+u.URL+`/v1", "api_key": "sk-provider-key"}},
		"models": {"fast": {"deployments": [{"provider": "oa", "model": "m1", "cost_input": 1000, "cost_output": 1000}]}},
		"consumer": "{http.request.header.X-Team}",
		"plans": {"default": {"budget": {"usd": 1.5, "per": 3600000000000}}}`+extra+`}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	return h
}

// budgetHoldsInFlight sends 8 requests of alice at once, alternating over
// hs (heldBudgetHandler's, on u): 2 reach the provider, 6 are refused with
// the budget's 429; once the 2 are answered, the budget admits again (on
// one of hs at least).
func budgetHoldsInFlight(t *testing.T, u *heldUpstream, hs []*Handler) {
	t.Helper()
	// Worst case: (prompt ~20 + max_tokens 1000) tokens at $0.001 = ~$1.02;
	// two of them are over $1.5, one is below.
	body := `{"model":"fast","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`
	alice := http.Header{"X-Team": {"alice"}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	var refused atomic.Int32
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, _, _ := askAs(hs[i%len(hs)], "/v1/chat/completions", body, alice)
			mu.Lock()
			codes[w.Code]++
			mu.Unlock()
			if w.Code == 429 {
				if w.Header().Get(HeaderConsumerLimit) != "budget" || !strings.Contains(w.Body.String(), "held") {
					t.Errorf("expected the consumer's budget 429 saying what is held, got %v %s", w.Header(), w.Body)
				}
				refused.Add(1)
			}
		}()
	}
	// Each request is at the provider or refused (with no hold, the router's
	// slow start lets 4 through and the others wait).
	settledWithin(func() bool { return u.arrived.Load()+refused.Load() == 8 })
	atProvider := u.arrived.Load()
	u.open()
	wg.Wait()
	if atProvider != 2 || codes[200] != 2 || codes[429] != 6 {
		t.Errorf("expected 2 requests at the provider and 6 refused (the budget holds 2 worst cases), got %d at the provider at once, codes %v", atProvider, codes)
	}
	// In a fleet, from the slice of an instance that held the two (another
	// gets it once that slice goes back idle, or is given back).
	again := 0
	var last string
	for _, h := range hs {
		w, _, _ := askAs(h, "/v1/chat/completions", body, alice)
		if w.Code == 200 {
			again++
		}
		last = fmt.Sprintf("%d %s", w.Code, w.Body)
	}
	if again == 0 {
		t.Errorf("after the two answers settled their holds at about $0.01 each: expected 200, got %s", last)
	}
}
