package sim

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	prov "github.com/llmrouter/caddy-llm-router/provider"
)

// world is one run of a scenario on one seed: the router, its groups,
// the providers, every random draw, the trace and the violations of the
// invariants, all in the virtual time of a synctest bubble.
type world struct {
	seed   uint64
	start  time.Time
	router *router.Router
	groups []*router.Group // groups[0] is the one the clients ask for
	sc     *setup

	mu         sync.Mutex
	rng        *rand.Rand
	trace      []string
	violations []string
	reqs       map[int]*attempts
	outcomes   []*outcome
	stories    map[int][]string // each request's texts, as its attempts told them
	// counted: past the warm-up; upstream429 the windows' 429s since.
	counted     bool
	upstream429 int
	summary     string                  // the run's figures (finish)
	timeline    timeline                // every timer's instant (w.mu)
	turns       turnstile               // the goroutines yielding now (w.mu)
	truth       map[*provider][]*window // the sized providers' windows when counting began (ideal)
}

// attempts is what the providers saw of one client request.
type attempts struct {
	tried    map[*provider]bool
	first    *provider
	inflight int
	hedges   int
	n        int
	// began: a stream of the request has sent its first word; resumed
	// are the providers asked after that (a resume's attempts).
	began   bool
	resumed []*provider
}

func newWorld(seed uint64, sc *setup) *world {
	w := &world{seed: seed, start: time.Now(), sc: sc, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)),
		reqs: map[int]*attempts{}, stories: map[int][]string{}}
	r := router.New()
	r.Rand = w.float
	r.Clock = clock{w}
	r.Logger = zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zapcore.EncoderConfig{MessageKey: "msg", LevelKey: "level",
		EncodeLevel: zapcore.LowercaseLevelEncoder}), zapcore.AddSync(traceWriter{w}), zapcore.DebugLevel))
	if sc.router != nil {
		sc.router(r)
	}
	w.router = r
	byGroup := map[int][]*router.Deployment{}
	for _, p := range sc.providers {
		p.start(w)
		byGroup[p.group] = append(byGroup[p.group], w.deployment(p))
	}
	for i := 0; len(byGroup[i]) > 0; i++ {
		g := router.NewGroup(fmt.Sprintf("group%d", i), byGroup[i])
		if i > 0 {
			w.groups[i-1].Fallback = g
		}
		w.groups = append(w.groups, g)
	}
	return w
}

// keyMark is in every provider's API key, and must reach no client.
const keyMark = "-sim-secret-key"

// deployment is p as the router's configuration makes it: the real
// adapter of p's dialect, the Caddyfile's default timeouts.
func (w *world) deployment(p *provider) *router.Deployment {
	ep := prov.Endpoint{BaseURL: "https://" + p.name + ".invalid/v1", APIKey: "sk-" + p.name + keyMark}
	var pv prov.Provider = &adapters.OpenAI{Endpoint: ep, Continuation: p.continues}
	if _, ok := p.dialect.(anthropic); ok {
		pv = &adapters.Anthropic{Endpoint: ep}
	}
	return &router.Deployment{Name: p.name, Model: p.family, Provider: pv, Transport: p, Tier: p.tier,
		Timeout: cmp.Or(p.timeout, router.DefaultTimeout), TTFTTimeout: router.DefaultTTFTTimeout, IdleTimeout: cmp.Or(p.idle, router.DefaultIdleTimeout),
		State: capacity.NewState(), Secrets: []string{ep.APIKey}, Weight: 1,
		CostInput: cmp.Or(p.price, 2), CostOutput: cmp.Or(p.price, 2)}
}

// float is the run's next random number in [0, 1).
func (w *world) float() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rng.Float64()
}

// exp is the run's next exponential draw of mean 1.
func (w *world) exp() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rng.ExpFloat64()
}

// elapsed is the virtual time since the run began.
func (w *world) elapsed() time.Duration { return time.Since(w.start) }

// logf adds an event to the trace.
func (w *world) logf(format string, args ...any) {
	line := fmt.Sprintf("%14.9fs  ", w.elapsed().Seconds()) + fmt.Sprintf(format, args...)
	w.mu.Lock()
	w.trace = append(w.trace, line)
	w.mu.Unlock()
}

// violate records a broken invariant (and traces it).
func (w *world) violate(format string, args ...any) {
	msg := fmt.Sprintf("%.3fs: ", w.elapsed().Seconds()) + fmt.Sprintf(format, args...)
	w.logf("VIOLATION %s", msg)
	w.mu.Lock()
	w.violations = append(w.violations, msg)
	w.mu.Unlock()
}

// traceWriter puts the router's log lines (its decisions) in the trace.
type traceWriter struct{ w *world }

func (t traceWriter) Write(b []byte) (int, error) {
	line := strings.TrimRight(string(b), "\n")
	if strings.Contains(line, keyMark) {
		line = strings.ReplaceAll(line, keyMark, "-****")
		t.w.violate("the router logged a provider's API key: %s", line)
	}
	t.w.logf("router %s", line)
	return len(b), nil
}

// arrive is told of each attempt when it reaches p: the invariants of
// stated cooldowns and hedges are checked at once. It returns the
// attempt's number in its request.
func (w *world) arrive(p *provider, u upstream, at time.Time) int {
	w.mu.Lock()
	a := w.reqs[u.id]
	if a == nil {
		a = &attempts{tried: map[*provider]bool{}, first: p}
		w.reqs[u.id] = a
	}
	a.tried[p] = true
	a.n++
	if a.began {
		a.resumed = append(a.resumed, p)
	}
	a.inflight++
	if a.inflight > 1 {
		a.hedges++
	}
	hedges, counted, n := a.hedges, w.counted, a.n
	w.mu.Unlock()
	p.mu.Lock()
	until, stated := p.cooldown, p.stated
	p.mu.Unlock()
	// From a millisecond after the statement's delivery: what the router
	// sent at that very instant may have been decided before it read it.
	if counted && at.Before(until) && at.Sub(stated) >= time.Millisecond {
		w.violate("r%d sent to %s %v inside the wait it stated", u.id, p.name, until.Sub(at))
	}
	if hedges > 1 {
		w.violate("r%d has %d attempts at once (at most one hedge)", u.id, hedges+1)
	}
	return n
}

// leave is told of each attempt when p has delivered it (an answer's
// headers, the end of a stream, or an attempt given up): a 429's stated
// wait holds from then.
// a is nil for an attempt given up before its answer.
func (w *world) leave(p *provider, id int, a *reply) {
	w.mu.Lock()
	if r := w.reqs[id]; r != nil {
		r.inflight--
	}
	if a != nil && a.status == 429 && a.window && w.counted {
		w.upstream429++ // a window's (a fault's stated wait is the scenario's)
	}
	w.mu.Unlock()
	if a != nil && !a.retryUntil.IsZero() {
		p.mu.Lock()
		if a.retryUntil.After(p.cooldown) {
			p.cooldown, p.stated = a.retryUntil, time.Now()
		}
		p.mu.Unlock()
	}
}

// told records a text an attempt at request id tells (a continuation's
// with the text it continues).
func (w *world) told(id int, story string) {
	w.mu.Lock()
	w.stories[id] = append(w.stories[id], story)
	w.mu.Unlock()
}

// began records that a stream of request id sent its first word.
func (w *world) began(id int) {
	w.mu.Lock()
	if a := w.reqs[id]; a != nil {
		a.began = true
	}
	w.mu.Unlock()
}
