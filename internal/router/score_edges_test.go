package router

import (
	"context"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// dOK is a fake provider that answers 200 every time.
func dOK() *script {
	return &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
}

func dNear(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// The cheapest and the fastest measured deployments score full marks on
// cost and on latency, whatever unmeasured ones sit between them; an
// unpriced or unmeasured deployment takes the mean of the known values.
func TestUnknownFeatureTakesMeanOfKnown(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)

	cheap, unpriced, dear := deployment("cheap", dOK()), deployment("unpriced", dOK()), deployment("dear", dOK())
	cheap.CostInput, cheap.CostOutput = 1, 1
	dear.CostInput, dear.CostOutput = 2, 2 // twice the price: half the marks
	r.Weights = Weights{Cost: 1}
	req := &Request{Request: chatReq.Request, Tokens: 10, PromptTokens: 1000}
	s := scoreOf(t, r, []*Deployment{cheap, unpriced, dear}, req, clock.Now())
	if !dNear(s["cheap"], 1) || !dNear(s["dear"], 0.5) || !dNear(s["unpriced"], 0.75) {
		t.Errorf("cost: expected cheap 1, dear 0.5 and unpriced their mean 0.75, got %v", s)
	}

	fast, unmeasured, slow := deployment("fast", dOK()), deployment("unmeasured", dOK()), deployment("slow", dOK())
	fast.State.RecordLatency(500*time.Millisecond, 0)
	slow.State.RecordLatency(time.Second, 0)
	r.Weights = Weights{Latency: 1}
	s = scoreOf(t, r, []*Deployment{fast, unmeasured, slow}, chatReq, clock.Now())
	wantSlow := (0.5 + latencySoftening) / (1 + latencySoftening)
	if !dNear(s["fast"], 1) || !dNear(s["slow"], wantSlow) || !dNear(s["unmeasured"], (1+wantSlow)/2) {
		t.Errorf("latency: expected fast 1, slow %v and unmeasured their mean, got %v", wantSlow, s)
	}
}

// A request that sets no max_tokens is priced with 256 output tokens: a
// deployment cheap on input but dear on output loses to one dear on input
// but cheap on output.
func TestCostCountsDefaultOutputTokens(t *testing.T) {
	r := newRouter(newFakeClock())
	r.Weights = Weights{Cost: 1}
	cheapIn, cheapOut := deployment("cheap-in", dOK()), deployment("cheap-out", dOK())
	cheapIn.CostInput, cheapIn.CostOutput = 1, 100 // 100*1 + 256*100
	cheapOut.CostInput, cheapOut.CostOutput = 2, 1 // 100*2 + 256*1
	req := &Request{Request: chatReq.Request, Tokens: 10, PromptTokens: 100}
	if res := r.Serve(context.Background(), []*Deployment{cheapIn, cheapOut}, req); res.Err != nil || res.Deployment != cheapOut {
		t.Errorf("expected the one cheaper with 256 output tokens, got %v %v", res.Deployment, res.Err)
	}
}

// With every weight 0 the ranking has nothing to say: deployments tie and
// the request is still served, by the one the near-tie draw picks (the
// first for a draw of 0, the second for 0.99), so that ties share traffic.
func TestAllWeightsZeroStillServes(t *testing.T) {
	for draw, want := range map[float64]string{0: "a", 0.99: "b"} {
		r := newRouter(newFakeClock())
		r.Weights = Weights{}
		r.Rand = func() float64 { return draw }
		a, b := deployment("a", dOK()), deployment("b", dOK())
		res := r.Serve(context.Background(), []*Deployment{a, b}, chatReq)
		got := ""
		if res.Deployment != nil {
			got = res.Deployment.Name
		}
		if res.Err != nil || got != want {
			t.Errorf("draw %v: expected a tie served by %s, got %q (%v)", draw, want, got, res.Err)
		}
	}
}

// A deployment this request would leave with nothing in a window scores 0
// on capacity, below one whose windows are unknown (0.5), and is not chosen.
func TestNoHeadroomLeftScoresZero(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	r.Weights = Weights{Capacity: 1}
	full, unknown := deployment("full", dOK()), deployment("unknown", dOK())
	withWindows(t, full, clock.Now(), provider.UnknownWindow, provider.Window{Limit: 1000, Remaining: 10, Reset: 30 * time.Second})
	req := &Request{Request: chatReq.Request, Tokens: 10}
	s := scoreOf(t, r, []*Deployment{full, unknown}, req, clock.Now())
	if sf, ok := s["full"]; !ok || sf != 0 || s["unknown"] != 0.5 {
		t.Fatalf("expected full usable with score 0 and unknown 0.5, got %v", s)
	}
	if res := r.Serve(context.Background(), []*Deployment{full, unknown}, req); res.Deployment != unknown {
		t.Errorf("expected the deployment with room left, got %v", res.Deployment)
	}
}

// dPick runs pick over hand-made candidates (scores and loads) of a group
// of len(scores) deployments, with the given weights and draws.
func dPick(scores, loads []float64, weights []int, draws ...float64) int {
	group := make([]*Deployment, len(scores))
	cands := make([]scored, len(scores))
	for k := range scores {
		group[k] = &Deployment{Name: string(rune('a' + k))}
		if weights != nil {
			group[k].Weight = weights[k]
		}
		cands[k] = scored{i: k, score: scores[k]}
		cands[k].f.Load = loads[k]
	}
	n := 0
	r := &Router{Rand: func() float64 { x := draws[min(n, len(draws)-1)]; n++; return x }}
	return r.pick(group, cands)
}

// pick shares the traffic among near-ties in proportion to weight (each
// owning its slice of [0, 1)), and of the two drawn takes the less loaded
// per unit of weight.
func TestPickNearTies(t *testing.T) {
	// A deployment exactly nearTie below the best is a near-tie: with a
	// draw of 0.75 of two equal shares it is drawn first, and kept.
	if k := dPick([]float64{1, 1 - nearTie}, []float64{0, 0}, nil, 0.75); k != 1 {
		t.Errorf("at the floor: expected the second candidate, got %d", k)
	}
	// A draw of exactly one half of two equal shares falls to the second.
	if k := dPick([]float64{1, 1}, []float64{0, 0}, nil, 0.5); k != 1 {
		t.Errorf("draw 0.5: expected the second candidate, got %d", k)
	}
	// The second drawn is the first candidate and less loaded: it wins.
	if k := dPick([]float64{1, 1}, []float64{0, 5}, nil, 0.75); k != 0 {
		t.Errorf("less loaded second draw: expected candidate 0, got %d", k)
	}
	// Load counts per unit of weight: 4 on weight 2 is less than 3 on 1.
	if k := dPick([]float64{1, 1}, []float64{3, 4}, []int{1, 2}, 0.2); k != 1 {
		t.Errorf("load per weight: expected candidate 1, got %d", k)
	}
	// After drawing candidate 0, the second draw is over the other two
	// alone: 0.4 of their two shares is candidate 1.
	if k := dPick([]float64{1, 1, 1}, []float64{5, 0, 1}, nil, 0.1, 0.4); k != 1 {
		t.Errorf("second draw among the rest: expected candidate 1, got %d", k)
	}
}

// Each routing decision is logged at debug level with the attempt's
// number, the deployment chosen and the candidates, separated by "; ".
func TestRoutingDecisionIsLogged(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	r := newRouter(newFakeClock())
	r.Logger = zap.New(core)
	a, b := deployment("a", dOK()), deployment("b", dOK())
	a.Quality = 1
	r.Serve(context.Background(), []*Deployment{a, b}, chatReq)
	entries := logs.FilterMessage("routing decision").All()
	if len(entries) != 1 {
		t.Fatalf("expected one routing decision, got %d", len(entries))
	}
	f := entries[0].ContextMap()
	c, _ := f["candidates"].(string)
	if f["attempt"] != int64(1) || f["chose"] != "a" || !strings.HasPrefix(c, "a score=") || !strings.Contains(c, "; b score=") {
		t.Errorf("expected attempt 1 choosing a among \"a ...; b ...\", got %v", f)
	}
}
