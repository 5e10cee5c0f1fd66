package router

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// A non-stream attempt the router leaves while its provider works (a
// hedge's loser, one whose client went away) is charged as a stream left
// so is: its prompt and max_tokens, in its deployment's usage and both
// budgets. The provider billed the prompt and goes on generating; before,
// it cost $0 and hedging spent a budget past its limit unseen.
func TestLeftAttemptIsCharged(t *testing.T) {
	const worst = 0.005 // budgetReq at budgetDeployment's prices: 100 prompt, max_tokens 80
	t.Run("hedge's loser", func(t *testing.T) {
		c := newFakeClock()
		slow := newGate(reply(200, budgetBody))
		a := &script{replies: []func(*http.Request) (*http.Response, error){slow.reply}}
		da := budgetDeployment("a", a)
		db := budgetDeployment("b", &script{replies: []func(*http.Request) (*http.Response, error){reply(200, budgetBody)}})
		da.Quality = 1
		da.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 1, Period: time.Hour}, nil, "deployment|a")
		r, _ := hedgeRouter(c)
		grp := NewGroup("paid", []*Deployment{da, db})
		grp.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 1, Period: time.Hour}, nil, "group|paid")
		done := make(chan *Result, 1)
		go func() { done <- r.ServeGroup(context.Background(), grp, budgetReq) }()
		eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
		c.Advance(2 * time.Second)
		if res := <-done; res.Err != nil || res.Deployment != db {
			t.Fatalf("expected b's answer, got %v %v", res.Err, res.Deployment)
		}
		eventually(t, "a cancelled", func() bool { return slow.cancelled.Load() == 1 })
		eventually(t, "a's hold settled", func() bool { return da.Spending.Report(c.Now()).HeldUSD == 0 })
		if rep := da.Spending.Report(c.Now()); rep.SpentUSD != worst {
			t.Errorf("the hedge's loser: %+v, want $%v spent", rep, worst)
		}
		if rep := grp.Spending.Report(c.Now()); rep.SpentUSD != 2*worst || rep.HeldUSD != 0 {
			t.Errorf("the group: %+v, want $%v spent (both attempts)", rep, 2*worst)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		c := newFakeClock()
		g := &heldGate{open: make(chan struct{})}
		d := budgetDeployment("a", g)
		d.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 1, Period: time.Hour}, nil, "deployment|a")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan *Result, 1)
		go func() { done <- newRouter(c).ServeGroup(ctx, NewGroup("paid", []*Deployment{d}), budgetReq) }()
		eventually(t, "the attempt", func() bool { return g.calls.Load() == 1 })
		cancel()
		<-done
		if rep := d.Spending.Report(c.Now()); rep.SpentUSD != worst || rep.HeldUSD != 0 {
			t.Errorf("after the client went away: %+v, want $%v spent", rep, worst)
		}
	})
}
