package router

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// Weights weigh the ranking's features. Each feature is normalized to 0..1
// (1 is best) among the deployments usable now, and a deployment's score is
// the weighted mean:
//
//		score = (cost*C + latency*L + reliability*R + quality*Q + capacity*K) / (sum of weights)
//
//	  - C: cheapest estimated USD for this request / this deployment's
//	    (prompt tokens x cost_input + max_tokens (or 256) x cost_output, per 1M);
//	  - L: (fastest + 0.1 s) / (this + 0.1 s), over the EWMA of time to first
//	    token for a stream, of total latency otherwise (0.1 s softens noise);
//	    an attempt that lost a hedge counts as at least as slow as the time
//	    it ran (capacity.State.RecordLostHedge), one cut by a timeout
//	    as a sample of that time would (RecordAtLeast);
//	  - R: the time-decayed success rate (half-life 5 min, one virtual success);
//	  - Q: the configured quality;
//	  - K: the smallest share left of any known rate-limit window (stated by
//	    the provider or declared) after this request; 0.5 when none is known.
//
// A feature nobody has measured (a price of 0, a latency never seen) takes
// the mean of the known values, so it neither wins nor loses by default.
type Weights struct {
	Cost, Latency, Reliability, Quality, Capacity float64
}

// DefaultWeights are the Caddyfile defaults: capacity counts double.
var DefaultWeights = Weights{Cost: 1, Latency: 1, Reliability: 1, Quality: 1, Capacity: 2}

// nearTie is the score gap under which deployments count as equal and share
// the traffic (in proportion to their weight) instead of herding onto one.
const nearTie = 0.03

// latencySoftening keeps milliseconds of noise from deciding the latency
// feature: 100 ms vs 120 ms is nearly a tie, 1 s vs 3 s is not.
const latencySoftening = 0.1

// defaultOutputTokens prices a request that sets no max_tokens.
const defaultOutputTokens = 256

// scored is one deployment as ranked for one choice.
type scored struct {
	i     int
	f     capacity.Features
	cost  float64 // estimated USD for this request; 0 = unknown price
	score float64
	// counts: f is of the deployment's CountState (a count of tokens,
	// Deployment.stateFor), which its forecasts read too.
	counts bool
}

// estimateCost returns the request's estimated USD on d (0 if unpriced).
func estimateCost(d *Deployment, req *Request) float64 {
	out := req.OutputTokens
	if out <= 0 {
		out = defaultOutputTokens
	}
	return (float64(req.PromptTokens)*d.CostInput + float64(out)*d.CostOutput) / 1e6
}

// score fills in the score of each candidate, all usable now.
func (r *Router) score(group []*Deployment, cands []scored) {
	w := r.Weights
	total := w.Cost + w.Latency + w.Reliability + w.Quality + w.Capacity
	if total <= 0 {
		for i := range cands {
			cands[i].score = 0
		}
		return
	}
	minLat, minCost := 0.0, 0.0
	for _, c := range cands {
		if l := c.f.Latency; l > 0 && (minLat == 0 || l < minLat) {
			minLat = l
		}
		if c.cost > 0 && (minCost == 0 || c.cost < minCost) {
			minCost = c.cost
		}
	}
	// Means of the known normalized values stand in for the unknown ones.
	latSum, latN, costSum, costN := 0.0, 0, 0.0, 0
	for _, c := range cands {
		if c.f.Latency > 0 {
			latSum += (minLat + latencySoftening) / (c.f.Latency + latencySoftening)
			latN++
		}
		if c.cost > 0 {
			costSum += minCost / c.cost
			costN++
		}
	}
	latMean, costMean := 1.0, 1.0
	if latN > 0 {
		latMean = latSum / float64(latN)
	}
	if costN > 0 {
		costMean = costSum / float64(costN)
	}
	for k := range cands {
		c := &cands[k]
		lat, cost, capac := latMean, costMean, 0.5
		if c.f.Latency > 0 {
			lat = (minLat + latencySoftening) / (c.f.Latency + latencySoftening)
		}
		if c.cost > 0 {
			cost = minCost / c.cost
		}
		if c.f.Headroom >= 0 {
			capac = c.f.Headroom
		}
		c.score = (w.Cost*cost + w.Latency*lat + w.Reliability*c.f.Reliability +
			w.Quality*group[c.i].Quality + w.Capacity*capac) / total
	}
}

// pick returns the index (into cands) of the deployment to try: the best
// score, or, among near-ties (within nearTie), the less loaded of two drawn
// at random in proportion to weight (power of two choices): equal
// deployments share the traffic evenly, in proportion to their weight, and
// a fleet of routers does not herd onto one of them.
func (r *Router) pick(group []*Deployment, cands []scored) int {
	best := 0
	for k := range cands {
		if cands[k].score > cands[best].score {
			best = k
		}
	}
	floor := cands[best].score - nearTie
	sum := 0
	for _, c := range cands {
		if c.score >= floor {
			sum += max(group[c.i].Weight, 1)
		}
	}
	first := r.draw(group, cands, floor, sum, -1)
	if first < 0 {
		return best // scores that compare to nothing (NaN: a cost that overflowed)
	}
	second := r.draw(group, cands, floor, sum, first)
	if second < 0 {
		return first
	}
	// Load per unit of weight: a deployment of weight 3 takes three times
	// the traffic before it counts as busier.
	lf := cands[first].f.Load / float64(max(group[cands[first].i].Weight, 1))
	ls := cands[second].f.Load / float64(max(group[cands[second].i].Weight, 1))
	if ls < lf {
		return second
	}
	return first
}

// draw picks a near-tie at random in proportion to weight, other than skip;
// -1 when there is none.
func (r *Router) draw(group []*Deployment, cands []scored, floor float64, sum, skip int) int {
	if skip >= 0 {
		sum -= max(group[cands[skip].i].Weight, 1)
	}
	if sum <= 0 {
		return -1
	}
	x := r.Rand() * float64(sum)
	last := -1
	for k, c := range cands {
		if c.score < floor || k == skip {
			continue
		}
		last = k
		x -= float64(max(group[c.i].Weight, 1))
		if x < 0 {
			return k
		}
	}
	return last
}

// describe renders the candidates for the debug log.
func describe(group []*Deployment, cands []scored, now time.Time) string {
	var b strings.Builder
	for k, c := range cands {
		if k > 0 {
			b.WriteString("; ")
		}
		b.WriteString(group[c.i].Name)
		if c.f.At.After(now) {
			b.WriteString(" cooling ")
			b.WriteString(c.f.At.Sub(now).Round(time.Millisecond).String())
			b.WriteString(" (" + c.f.Why.String() + ")")
			continue
		}
		b.WriteString(" score=" + strconv.FormatFloat(c.score, 'f', 3, 64))
		b.WriteString(" headroom=" + strconv.FormatFloat(c.f.Headroom, 'f', 2, 64))
		b.WriteString(" latency=" + strconv.FormatFloat(c.f.Latency, 'f', 3, 64))
		b.WriteString(" reliability=" + strconv.FormatFloat(c.f.Reliability, 'f', 2, 64))
		b.WriteString(" in_flight=" + strconv.Itoa(c.f.InFlight))
	}
	return b.String()
}

// CacheMargin is the score margin (of 0..1) within which a request is kept
// on the deployment that last served its prompt-cache prefix rather than
// the best-ranked one (Request.PreferMargin): a cache read costs a tenth
// of the input price on Anthropic and at most half on OpenAI, which
// outweighs a tenth of the ranking's range, but not more.
const CacheMargin = 0.1

// preferred returns the index in cands (all usable now) of req.Prefer,
// -1 when it is not among them or, with a PreferMargin, when its score is
// further below the best one's.
func (r *Router) preferred(group []*Deployment, cands []scored, req *Request) int {
	k := slices.IndexFunc(cands, func(c scored) bool { return group[c.i] == req.Prefer })
	if k < 0 || req.PreferMargin <= 0 || len(cands) == 1 {
		return k
	}
	r.score(group, cands)
	for _, c := range cands {
		if c.score > cands[k].score+req.PreferMargin {
			return -1
		}
	}
	return k
}
