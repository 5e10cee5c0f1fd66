package sim

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/router"
	prov "github.com/llmrouter/caddy-llm-router/provider"
)

// scenario is a named run, each of the kinds one or more: build
// draws its parameters (latencies, dialects, window shapes, which
// deployment fails) from the seed.
type scenario struct {
	name  string
	kind  int // the kind it proves; 0: none (the baseline)
	build func(d *draw) *setup
}

// setup is a scenario's run on one seed.
type setup struct {
	providers []*provider
	router    func(*router.Router)
	clients   clients
	// limitsStated: the providers state their windows, so that the
	// router can keep to them (upstream 429s per served <= 0.01, every 429
	// at once).
	limitsStated bool
	// checks are the scenario's own invariants over the run: a message
	// when one is broken.
	checks []func(*world) string
}

// knownFailing are the scenarios of kinds not fixed on main yet, with
// their kind: make sim reports them and does not fail for them, but fails
// when one passes on every seed (take it out of the list then). The
// integration engineer empties it as the fixes land.
//
// rounded-resets and token-window cannot pass on every seed, whatever the
// router does with what it reads (twins_test.go checks the premises): the
// burst arrives 11 s after the warm-up, and every request it cannot serve
// must be told within 50 ms, before its first answer (90 ms at least);
// until then the router has read one statement, the warm-up's, which a
// twin world states byte for byte while its ideal differs:
//   - rounded-resets, aligned (seeds 1, 2, 8, 13, 16, 17, 18 of 20): the
//     warm-up, sent at midnight, is at an aligned window's boundary and
//     states "10", 9 left, as the first request of a window from the first
//     request does. Aligned, the burst at 11.1 s is served at 11.1, 20, 30
//     and 40 s, 40 by its 30 s deadline; from the first request, at 11.1,
//     21.1 and 31.1 s, and the next window starts at the deadline: 30. At
//     11.15 s a router must have told 20 requests (aligned) or 30 (from
//     the first), the same decision on the same wire: it fails one of the
//     two shapes, which the scenario draws alike.
//   - token-window, aligned (seeds 3, 4, 6, 8, 11, 14): the same with
//     949-token requests, four to a 4,000-token window, 20 s deadline: 12
//     aligned, 8 from the first request.
//   - token-window, bucket, Anthropic (seeds 5, 12, 13, 16): a reset is an
//     instant in whole seconds: "3051 left, full at 00:00:03" is a bucket
//     of 4,000 per 10 s (949 tokens in 2.37 s) as well as one of 4,000 per
//     12.5 s (2.97 s), which serves 10 of the burst, not 12.
//   - token-window, bucket, OpenAI (seeds 7, 20; they pass): "3051 left,
//     2.373s" is a bucket's 949 tokens at 400 a second, and the first
//     request of a window of 4,000 per 2.3725 s that starts with it, which
//     serves all 30. Within the shapes PROVIDERS.md names (buckets, fixed
//     windows aligned to clock minutes) it is a bucket's: its reset falls
//     between two whole seconds, where no window aligned to the clock
//     ends, and the router forecasts it as the bucket it implies
//     (capacity's offTheClock); a window from its first request so
//     stated is forecast short until its next statement.
var knownFailing = map[string]int{
	// window-roll cannot pass on every seed either: until the burst's
	// first answer (1.8 s at least with 2 s answers, 18 s with 20 s) the
	// router has read the warm-up's statement alone, and must tell every
	// request it cannot serve within 50 ms; a twin world states the
	// warm-up byte for byte with another ideal:
	//   - 2 s answers, one deployment, aligned (seeds 4, 13 of 20): "9
	//     left, 10s" at midnight is an aligned window's and a window's
	//     from its first request. Aligned, the burst at 13 s is served in
	//     the windows at 13, 20, 30 and 40 s (the last reached by 41.9 s
	//     from the statements, answered by 44.1 s, before the 45 s
	//     deadline): 40, 20 told at once. From the first request: at 13,
	//     23, 33 and 43 s, whose answers end at the deadline: 30, 30 told.
	//     So a scheduler that sees only the wire serves 30 here or tells
	//     10 late in the twin; the 40 is not reachable on both.
	//   - 20 s answers on a bucket (seeds 14, 21, 33, 42 of 50; 38 at
	//     2 s; 19 at 100 ms): "9 left, 1s" is a bucket's of one a second
	//     (37 served; 39 with 100 ms answers) and a window's of 10 per
	//     second from its first request (60; twins_test.go). The router
	//     paces at the bucket's rate (no upstream 429, 37-38 served) and
	//     tells the rest as its forecast learns, not at once: with 100
	//     ms answers when the burst's answers prove the bucket (93 ms).
	//   - 20 s answers on a fixed window (seeds 25, 26, 46, 47, 49): "9
	//     left, 10s" is a window's of 10 per 10 s (30) and a bucket's of
	//     10 per 100 s (13); paced as the bucket until the burst's answers
	//     prove it fixed (20 s later), then holding what a span allows
	//     whatever the windows' phase (aligned or from the first request:
	//     the proof does not say) until an answer to a paced attempt
	//     does, the router serves 20-21 (12 paced to that answer).
	//   - Anthropic's 20 s answers (seeds 11, 23, 50; 28, 35 with two
	//     deployments): every instant is read after it passed. "9 left,
	//     reset 00:00:10" from the warm-up at midnight, then "00:00:40"
	//     for the burst at 32 s, are a 10 s window's aligned (40 served:
	//     30, 40, 50 and 60 s) and a 30 s window's (20: 30 and 40 s, the
	//     next at 70 s is past the deadline); a bucket's "full at
	//     00:00:01" (37) is a 30 s window's too. The router serves 20.
	"window-roll":    1,
	"rounded-resets": 1,
	"token-window":   2,
}

// draw is a scenario's random choices of its parameters.
type draw struct{ r *rand.Rand }

func (d *draw) pick(n int) int { return d.r.IntN(n) }

func (d *draw) dialect() dialect { return [...]dialect{openAI{}, anthropic{}}[d.pick(2)] }

func (d *draw) shape() shape { return shape(d.pick(3)) }

// stating gives each of ps a drawn way of stating a 429's wait.
func (d *draw) stating(ps ...*provider) []*provider {
	for _, p := range ps {
		p.retry = retryAfter(d.pick(3))
	}
	return ps
}

// healthy is a provider that only its windows limit: the ideal
// scheduler counts it.
func healthy(name, family string, dl dialect, latency time.Duration, limits ...limit) *provider {
	return &provider{name: name, family: family, dialect: dl, limits: limits, latency: latency, perWord: 5 * time.Millisecond, sized: true}
}

// unsized leaves ps out of the ideal scheduler: a scenario of resumes
// measures splices and waits, not capacity.
func unsized(ps ...*provider) []*provider {
	for _, p := range ps {
		p.sized = false
	}
	return ps
}

// failing is a provider that always fails with f.
func failing(name, family string, dl dialect, f fault) *provider {
	return &provider{name: name, family: family, dialect: dl, latency: 100 * time.Millisecond, perWord: 5 * time.Millisecond,
		faults: []fault{f}, limits: []limit{{max: 1000, span: time.Minute, shape: bucket}}}
}

func requests(n int64, span time.Duration, s shape) limit { return limit{max: n, span: span, shape: s} }

func tokens(n int64, span time.Duration, s shape) limit {
	return limit{tokens: true, max: n, span: span, shape: s}
}

func deadline(d time.Duration) func(*router.Router) { return func(r *router.Router) { r.Deadline = d } }

var scenarios = []scenario{
	{name: "baseline", build: func(d *draw) *setup {
		// Roomy windows, several dialects and latencies: everything is
		// served, every invariant holds.
		lat := [...]time.Duration{10 * time.Millisecond, 300 * time.Millisecond, 2 * time.Second}
		return &setup{providers: []*provider{
			healthy("a", "gpt-sim", openAI{}, lat[d.pick(3)], requests(600, time.Minute, d.shape())),
			healthy("b", "gpt-sim", d.dialect(), lat[d.pick(3)], requests(600, time.Minute, d.shape()), tokens(1e6, time.Minute, bucket)),
		}, clients: clients{n: 80, spread: 30 * time.Second, streams: 0.5, priorities: 3, prompt: 400, maxTokens: 64, messages: 0.5},
			limitsStated: true}
	}},
	{name: "window-roll", kind: 1, build: func(d *draw) *setup {
		// Fixed windows (or buckets) under a burst: the reset is stated at
		// admission and read one generation later.
		lat := [...]time.Duration{100 * time.Millisecond, 2 * time.Second, 20 * time.Second}[d.pick(3)]
		s := &setup{router: deadline(30*time.Second + lat), limitsStated: true,
			clients: clients{n: 60, prompt: 200, maxTokens: 16, warm: true}}
		if lat < router.DefaultTTFTTimeout {
			s.clients.streams = float64(d.pick(2)) // 20 s to the first byte is past ttft_timeout
		}
		if d.pick(2) == 0 {
			s.providers = []*provider{healthy("one", "gpt-sim", d.dialect(), lat, requests(10, 10*time.Second, d.shape()))}
		} else {
			s.clients.n = 100
			s.providers = []*provider{healthy("ten", "gpt-sim", d.dialect(), lat, requests(10, 10*time.Second, d.shape())),
				healthy("thirty", "gpt-sim", d.dialect(), lat, requests(30, 10*time.Second, d.shape()))}
		}
		d.stating(s.providers...)
		return s
	}},
	{name: "rounded-resets", kind: 1, build: func(d *draw) *setup {
		// A compatible server that rounds its countdowns down to whole
		// seconds ("8" for 8.87 s), fixed windows aligned to the clock or
		// from the first request, a burst: the router must not take a
		// window to be full again before it is.
		p := healthy("one", "gpt-sim", floorSecs{plain: d.pick(2) == 0}, 100*time.Millisecond,
			requests(10, 10*time.Second, [...]shape{aligned, fromFirst}[d.pick(2)]))
		return &setup{router: deadline(30 * time.Second), limitsStated: true, providers: []*provider{p},
			clients: clients{n: 60, prompt: 200, maxTokens: 16, warm: true}}
	}},
	{name: "token-window", kind: 2, build: func(d *draw) *setup {
		// 30 requests of max_tokens 900 on 4,000 tokens per 10 s: those
		// no window can serve before their deadline are told at once.
		return &setup{router: deadline(20 * time.Second), limitsStated: true,
			providers: d.stating(healthy("tpm", "gpt-sim", d.dialect(), 100*time.Millisecond, tokens(4000, 10*time.Second, d.shape()))),
			clients:   clients{n: 30, prompt: 200, maxTokens: 900, warm: true}}
	}},
	{name: "failover-wall", kind: 3, build: func(d *draw) *setup {
		// Tier 1 is east (429, Retry-After 30, past the deadline) and
		// west (500 on every request); tier 2 and the fallback group are
		// healthy: nobody gets 502 or 429 (a wait for east when it comes
		// back before the deadline is the tiers' rule, and no fault).
		east := failing("east", "gpt-sim", openAI{}, fault{kind: limited, wait: 30 * time.Second})
		west := failing("west", "gpt-sim", openAI{}, fault{kind: failStatus, status: 500, errKind: "server", msg: "The server had an error while processing your request."})
		claude := healthy("claude", "claude-sim", anthropic{}, 300*time.Millisecond, requests(1000, time.Minute, bucket))
		claude.tier = 2
		cheap := healthy("cheap", "gpt-mini-sim", d.dialect(), 200*time.Millisecond, requests(1000, time.Minute, bucket))
		cheap.group = 1
		ps := []*provider{east, west, claude, cheap}
		if d.pick(2) == 0 {
			ps[0], ps[1] = west, east
		}
		return &setup{router: func(r *router.Router) { r.Deadline, r.MaxAttempts = 20*time.Second, 4 },
			providers: ps, clients: clients{n: 12, spread: 24 * time.Second, streams: 0.5, prompt: 100}}
	}},
	{name: "revoked-keys", kind: 3, build: func(d *draw) *setup {
		// Five of six deployments have revoked keys (401, 403, 402); the
		// sixth is healthy: max_attempts is not spent on the revoked.
		why := []fault{
			{kind: failStatus, status: 401, errKind: "auth", msg: "Incorrect API key provided: {key}."},
			{kind: failStatus, status: 403, errKind: "denied", msg: "Country, region, or territory not supported"},
			{kind: failStatus, status: 402, errKind: "billing", msg: "Your credit balance is too low to access the API."},
		}
		var ps []*provider
		ok := d.pick(6)
		for i := range 6 {
			name := fmt.Sprintf("d%d", i)
			if i == ok {
				// the dearest: ranked last
				p := healthy(name, "gpt-sim", d.dialect(), 200*time.Millisecond, requests(1000, time.Minute, bucket))
				p.price = 4
				ps = append(ps, p)
				continue
			}
			ps = append(ps, failing(name, "gpt-sim", d.dialect(), why[d.pick(3)]))
		}
		return &setup{router: func(r *router.Router) { r.Deadline, r.MaxAttempts = 20*time.Second, 4 },
			providers: ps, clients: clients{n: 10, spread: 10 * time.Second, prompt: 100}}
	}},
	{name: "too-large", kind: 4, build: func(d *draw) *setup {
		// A's token window is smaller than the big requests: they go to B
		// (where there is a B), A is cooled for nobody, and where they fit
		// nowhere the client gets one clear non-retryable error.
		s := &setup{router: deadline(20 * time.Second), limitsStated: true,
			providers: []*provider{cheapest(healthy("a", "gpt-sim", openAI{}, 200*time.Millisecond, tokens(30000, time.Minute, bucket)))},
			clients:   clients{n: 40, spread: 40 * time.Second, prompt: 1000, maxTokens: 256, bigEvery: 4, bigPrompt: 4 * 36000},
			checks:    []func(*world) string{tooLargeTold}}
		if d.pick(2) == 0 {
			s.providers = append(s.providers, healthy("b", "gpt-sim", openAI{}, 400*time.Millisecond, tokens(400000, time.Minute, bucket)))
			s.checks = append(s.checks, smallOn(s.providers[0], 0.8))
		}
		return s
	}},
	{name: "half-open", kind: 5, build: func(d *draw) *setup {
		// A burst of slow 500s on the top-ranked (the faster) deployment,
		// many in flight at once: once its probe has answered, it serves
		// again.
		a := healthy("top", "gpt-sim", d.dialect(), 400*time.Millisecond, requests(1000, time.Minute, bucket))
		a.faults = []fault{{kind: failStatus, status: 500, errKind: "server", msg: "Internal server error", until: time.Duration(3+d.pick(3)) * time.Second,
			wait: time.Duration(1+d.pick(2)) * time.Second}}
		b := healthy("next", "gpt-sim", d.dialect(), 500*time.Millisecond, requests(1000, time.Minute, bucket))
		return &setup{providers: []*provider{a, b}, clients: clients{n: 120, spread: 15 * time.Second, prompt: 100, maxTokens: 8, streams: float64(d.pick(3)) / 2},
			checks: []func(*world) string{servesAgain(a, 4)}}
	}},
	{name: "resume-afresh", kind: 6, build: func(d *draw) *setup {
		// Streams cut mid-way on a; b takes up a continuation but answers
		// afresh (it ignores the prefill): nothing is spliced twice.
		a := cheapest(healthy("a", "claude-sim", anthropic{}, 100*time.Millisecond, requests(1000, time.Minute, bucket)))
		a.faults = []fault{{kind: cut, after: 3 + d.pick(3)}}
		b := healthy("b", "claude-sim", d.dialect(), 150*time.Millisecond, requests(1000, time.Minute, bucket))
		b.cont, b.continues = afresh, prov.PrefixFlag
		return &setup{providers: unsized(a, b),
			clients: clients{n: 20, spread: 20 * time.Second, streams: 1, prompt: 100, greedy: 0.5, messages: 0.5}}
	}},
	{name: "resume-prefill-refused", kind: 6, build: func(d *draw) *setup {
		// b refuses prefill (Claude 4.6): it is asked once, then
		// remembered.
		a := cheapest(healthy("a", "claude-sim", anthropic{}, 100*time.Millisecond, requests(1000, time.Minute, bucket)))
		a.faults = []fault{{kind: [...]faultKind{cut, midError}[d.pick(2)], after: 3 + d.pick(3)}}
		b := healthy("b", "claude-sim", anthropic{}, 150*time.Millisecond, requests(1000, time.Minute, bucket))
		b.cont = refuses
		return &setup{providers: unsized(a, b),
			clients: clients{n: 20, spread: 20 * time.Second, streams: 1, prompt: 100, greedy: 0.5, messages: 0.5},
			checks:  []func(*world) string{refusedOnce}}
	}},
	{name: "resume-silent", kind: 6, build: func(d *draw) *setup {
		// a's streams break; b, of the same model, cools for 15 s; c is
		// another model: the client's stream is never silent past
		// idle_timeout (10 s here), and no replay is tried on c, whose
		// answer cannot match.
		a := cheapest(healthy("a", "claude-sim", anthropic{}, 100*time.Millisecond, requests(1000, time.Minute, bucket)))
		a.faults = []fault{{kind: cut, after: 3 + d.pick(3)}}
		b := healthy("b", "claude-sim", anthropic{}, 150*time.Millisecond, requests(1000, time.Minute, bucket))
		b.faults = []fault{{kind: limited, wait: 15 * time.Second, until: 40 * time.Second}}
		c := healthy("c", "gpt-sim", openAI{}, 150*time.Millisecond, requests(1000, time.Minute, bucket))
		for _, p := range []*provider{a, b, c} {
			p.idle = 10 * time.Second
		}
		return &setup{providers: unsized(a, b, c), router: func(r *router.Router) { r.Resume = router.ResumeAny },
			clients: clients{n: 10, spread: 30 * time.Second, streams: 1, prompt: 100, greedy: 0.5, messages: 0.5},
			checks:  []func(*world) string{silentAtMost(10 * time.Second), notResumedOn("c")}}
	}},
	{name: "hedge-slow", kind: 7, build: func(d *draw) *setup {
		// With hedge_after, a deployment that got slow stops being chosen
		// first once its lost hedges have taught the ranking.
		slow := cheapest(healthy("slow", "gpt-sim", d.dialect(), 150*time.Millisecond, requests(1000, time.Minute, bucket)))
		slow.faults = []fault{{kind: slowed, wait: time.Duration(3+d.pick(5)) * time.Second, from: 10 * time.Second}}
		fast := healthy("fast", "gpt-sim", d.dialect(), 200*time.Millisecond, requests(1000, time.Minute, bucket))
		return &setup{providers: []*provider{slow, fast}, router: func(r *router.Router) { r.HedgeAfter = time.Second },
			clients: clients{n: 40, spread: 80 * time.Second, streams: float64(d.pick(2)), prompt: 100, maxTokens: 8},
			checks:  []func(*world) string{chosenFirst("slow", 30*time.Second, 0.2, false)}}
	}},
	{name: "long-answer", kind: 8, build: func(d *draw) *setup {
		// Non-streaming answers of 45 or 52 s under the defaults (deadline
		// 60 s, no timeout set): a working provider is allowed to finish.
		lat := [...]time.Duration{45 * time.Second, 52 * time.Second}[d.pick(2)]
		ps := []*provider{healthy("a", "gpt-sim", d.dialect(), lat, requests(1000, time.Minute, bucket)),
			healthy("b", "gpt-sim", d.dialect(), lat, requests(1000, time.Minute, bucket))}
		return &setup{providers: ps, clients: clients{n: 4, spread: 20 * time.Second, prompt: 100, maxTokens: 8}}
	}},
	{name: "give-up", kind: 8, build: func(d *draw) *setup {
		// Every deployment fails: the client, an SDK that retries, is told
		// not to retry, and no Retry-After puts it to sleep for an outage
		// the router probes in seconds.
		f := fault{kind: failStatus, status: [...]int{500, 503}[d.pick(2)], errKind: "server", msg: "upstream unavailable"}
		return &setup{providers: []*provider{failing("a", "gpt-sim", d.dialect(), f), failing("b", "gpt-sim", d.dialect(), f)},
			router:  deadline(10 * time.Second),
			clients: clients{n: 6, spread: 30 * time.Second, prompt: 100, sdk: true, streams: 0.5},
			checks:  []func(*world) string{toldNotToRetry}}
	}},
	{name: "mixed", build: func(d *draw) *setup {
		// Everything at once: a daily quota, a 5xx burst, timeouts, stalls
		// and cuts, drifting latencies, priorities, open-loop arrivals.
		daily := healthy("daily", "gpt-sim", openAI{}, 300*time.Millisecond, requests(25, 24*time.Hour, aligned))
		burst := healthy("burst", "gpt-sim", d.dialect(), 200*time.Millisecond, requests(30, 10*time.Second, d.shape()))
		burst.faults = []fault{{kind: failStatus, status: 502, errKind: "server", msg: "Bad gateway", from: 10 * time.Second, until: 13 * time.Second}}
		burst.drift = 0.5
		flaky := healthy("flaky", "gpt-sim", d.dialect(), time.Second, tokens(20000, time.Minute, bucket))
		flaky.faults = []fault{{kind: hang, p: 0.05}, {kind: stall, after: 2, wait: 45 * time.Second, p: 0.1}, {kind: cut, after: 4, p: 0.1}}
		flaky.sized, burst.sized = false, false
		return &setup{providers: d.stating(daily, burst, flaky), limitsStated: true,
			clients: clients{n: 150, spread: 60 * time.Second, streams: 0.5, priorities: 3, prompt: 800, maxTokens: 128, messages: 0.3, greedy: 0.3}}
	}},
}

// cheapest makes the ranking prefer p at the start (half the others'
// price), so that the scenario's fault is met first.
func cheapest(p *provider) *provider {
	p.price = 1
	return p
}

// chosenFirst: of the requests that arrived after from, the share whose
// first attempt went to name is at least share (atLeast) or at most it.
func chosenFirst(name string, from time.Duration, share float64, atLeast bool) func(*world) string {
	return func(w *world) string {
		by, n := w.firstChoices(from)
		got := float64(by[name]) / float64(max(n, 1))
		if atLeast == (got >= share) {
			return ""
		}
		return fmt.Sprintf("%s chosen first for %d of the %d requests after %v (%s)", name, by[name], n, from, w.perAnswer())
	}
}

// servesAgain: once p's answer to an attempt sent after its faults ended
// came (its probe's), it is chosen first for one of the next n requests
// at least.
func servesAgain(p *provider, n int) func(*world) string {
	return func(w *world) string {
		end := p.faults[0].until
		i := slices.IndexFunc(p.answered, func(t time.Duration) bool { return t >= end })
		if i < 0 {
			return fmt.Sprintf("%s never answered after its faults ended at %v", p.name, end)
		}
		probed := p.answered[i]
		os := slices.Clone(w.outcomes)
		slices.SortFunc(os, func(a, b *outcome) int { return cmp.Compare(a.arrival, b.arrival) })
		first, next := 0, 0
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, o := range os {
			if a := w.reqs[o.id]; o.arrival > probed && next < n && a != nil {
				next++
				if a.first == p {
					first++
				}
			}
		}
		if first > 0 || next == 0 {
			return ""
		}
		return fmt.Sprintf("%s answered its probe at %v, then was chosen first for %d of the next %d requests", p.name, probed, first, next)
	}
}

// tooLargeTold: a request larger than every window's limit gets one
// clear non-retryable error (413 or 400), at its first attempt at most.
func tooLargeTold(w *world) string {
	for _, o := range w.outcomes {
		fits := false
		for _, p := range w.sc.providers {
			for _, win := range p.windows {
				fits = fits || win.tokens && win.fits(o.tokens)
			}
		}
		w.mu.Lock()
		n := 0
		if a := w.reqs[o.id]; a != nil {
			n = a.n
		}
		w.mu.Unlock()
		if !fits && (o.status != http.StatusRequestEntityTooLarge && o.status != http.StatusBadRequest || n > 1) {
			return fmt.Sprintf("r%d (%d tokens, over every window) answered %d after %d attempts, Retry-After %q", o.id, o.tokens, o.status, n, o.header.Get("Retry-After"))
		}
	}
	return ""
}

// smallOn: of the requests that fit p's windows, at least share went
// first to p (the cheapest): a request too large for it cooled it for
// nobody.
func smallOn(p *provider, share float64) func(*world) string {
	return func(w *world) string {
		w.mu.Lock()
		defer w.mu.Unlock()
		small, on := 0, 0
		for _, o := range w.outcomes {
			if a := w.reqs[o.id]; a != nil && !slices.ContainsFunc(p.windows, func(win *window) bool { return !win.fits(win.cost(o.tokens)) }) {
				small++
				if a.first == p {
					on++
				}
			}
		}
		if float64(on) >= share*float64(small) {
			return ""
		}
		return fmt.Sprintf("%d of the %d requests that fit %s went there first (%s was cooled for them)", on, small, p.name, p.name)
	}
}

// refusedOnce: a deployment that refused prefill is not asked for one
// once its refusal has come back (requests that broke at once may ask it
// together).
func refusedOnce(w *world) string {
	for _, p := range w.sc.providers {
		if len(p.refusals) == 0 {
			continue
		}
		told := p.refusals[0].Add(errLatency + time.Millisecond)
		if again := slices.IndexFunc(p.refusals, func(t time.Time) bool { return !t.Before(told) }); again >= 0 {
			return fmt.Sprintf("%s refused prefill %d times, again %v after its first refusal came back", p.name, len(p.refusals),
				p.refusals[again].Sub(p.refusals[0]))
		}
	}
	return ""
}

// notResumedOn: no resume of a broken stream went to name.
func notResumedOn(name string) func(*world) string {
	return func(w *world) string {
		w.mu.Lock()
		defer w.mu.Unlock()
		for id, a := range w.reqs {
			if slices.ContainsFunc(a.resumed, func(p *provider) bool { return p.name == name }) {
				return fmt.Sprintf("r%d's broken stream was taken up on %s, whose answer cannot match it", id, name)
			}
		}
		return ""
	}
}

// silentAtMost: no client's stream was silent longer than d.
func silentAtMost(d time.Duration) func(*world) string {
	return func(w *world) string {
		for _, o := range w.outcomes {
			if o.maxGap > d {
				return fmt.Sprintf("r%d's stream was silent for %v (idle_timeout %v)", o.id, o.maxGap, d)
			}
		}
		return ""
	}
}

// toldNotToRetry: every error the router gave up with says
// x-should-retry: false, and a Retry-After of at most a minute.
func toldNotToRetry(w *world) string {
	for _, o := range w.outcomes {
		if o.status < 400 {
			continue
		}
		if o.header.Get("x-should-retry") != "false" {
			return fmt.Sprintf("r%d: %d without x-should-retry: false (the SDK tried %d times)", o.id, o.status, o.tries)
		}
		if ra, err := strconv.Atoi(o.header.Get("Retry-After")); err == nil && ra > 60 {
			return fmt.Sprintf("r%d: %d with Retry-After %d s for an outage the router probes in seconds", o.id, o.status, ra)
		}
	}
	return ""
}
