package fleet

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// heldProvider holds each attempt until opened and counts those that
// reached it; each answer costs $0.005 at holdInstance's prices.
type heldProvider struct {
	calls atomic.Int32
	open  chan struct{}
}

const heldBody = `{"id":"x","object":"chat.completion","model":"up","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":80,"total_tokens":180}}`

func (p *heldProvider) RoundTrip(req *http.Request) (*http.Response, error) {
	p.calls.Add(1)
	select {
	case <-p.open:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(heldBody)), Request: req}, nil
}

// holdInstance is one router instance's group "paid": one deployment at
// $10 and $50 per 1M input and output tokens, under a group budget of
// $0.01 per hour spent through the instance's store.
func holdInstance(in *instance, p *heldProvider) *router.Group {
	in.state.Declare(10000, 0)
	d := &router.Deployment{Name: "p/up", Model: "up",
		Provider:  &adapters.OpenAI{Endpoint: provider.Endpoint{BaseURL: "http://p.invalid/v1", APIKey: "sk-p"}},
		Transport: p, Timeout: 30 * time.Second, TTFTTimeout: 15 * time.Second, IdleTimeout: 30 * time.Second,
		Weight: 1, State: in.state, CostInput: 10, CostOutput: 50}
	g := router.NewGroup("paid", []*router.Deployment{d})
	g.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 0.01, Period: time.Hour}, in.store, "budget:group|paid")
	return g
}

// Two instances sharing Redis, a group budget of $0.01 per hour and 8
// concurrent requests (4 through each) whose worst case and answer cost
// $0.005: each attempt holds its worst case in the fleet's budget before
// it is sent, atomically, so exactly 2 reach the provider between them.
func TestFleetBudgetHeldBeforeDispatch(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
		p := &heldProvider{open: make(chan struct{})}
		groups := []*router.Group{holdInstance(a, p), holdInstance(b, p)}
		r := router.New()
		req := &router.Request{Request: &provider.Request{Format: provider.Chat, Choices: 1,
			Body: []byte(`{"model":"paid","max_tokens":80,"messages":[{"role":"user","content":"hi"}]}`)},
			Tokens: 180, PromptTokens: 100, OutputTokens: 80}

		var answered atomic.Int32
		statuses := make([]int, 8)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				res := r.ServeGroup(context.Background(), groups[i%2], req)
				statuses[i] = res.Status
				if e, ok := res.Err.(*router.Error); ok {
					statuses[i] = e.Status
				}
				answered.Add(1)
			})
		}
		eventually(t, 10*time.Second, "each request at the provider or answered", func() bool {
			return answered.Load()+p.calls.Load() >= 8
		})
		close(p.open)
		wg.Wait()
		if n := p.calls.Load(); n != 2 {
			t.Errorf("expected exactly 2 upstream calls across the fleet, got %d (statuses %v)", n, statuses)
		}
		served := 0
		for _, s := range statuses {
			switch s {
			case 200:
				served++
			case 429:
			default:
				t.Errorf("expected 200 or 429, got %v", statuses)
			}
		}
		if served != 2 {
			t.Errorf("expected 2 served, got %v", statuses)
		}
		total, err := a.store.Spend(context.Background(), "budget:group|paid:"+strconv.FormatInt(time.Now().UnixNano()/int64(time.Hour), 10))
		if err != nil || total < 0.01-1e-9 || total > 0.01+1e-9 {
			t.Errorf("expected the fleet's total $0.01, got %v %v", total, err)
		}
	})
}
