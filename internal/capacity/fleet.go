package capacity

import (
	"github.com/llmrouter/caddy-llm-router/provider"

	"time"
)

// Fleet mode: several router instances (processes) spend the same provider
// accounts, so what one of them learns about a deployment is worth sharing,
// and the operator's declared rpm/tpm must be counted across all of them.
//
// A State bound to a Fleet (SetFleet) stays the fast path: ranking reads
// only local memory. The State tells its Fleet what changed after each
// Observe (Publish, which must not block), and the Fleet folds what other
// instances learned into the State (Merge) in the background. Only three
// decisions ask the fleet on the request path, all in Acquire and outside
// the State's lock: a half-open circuit's single probe (ClaimProbe), the
// budget of the windows the provider stated (Spend: one budget for the
// fleet), and a deployment with declared rpm/tpm (Reserve). When the fleet cannot answer
// (its store is slow or down), the State decides on local knowledge alone.

// Fleet is what a State needs of a fleet store, bound to one deployment.
// Implementations must be safe for concurrent use; Publish and ReleaseProbe
// are called with the State's lock held and must neither block nor call
// back into the State.
type Fleet interface {
	// Publish hands the parts of the state that changed (those with a
	// non-zero At) to the fleet.
	Publish(Shared)
	// Reserve counts one attempt of tokens tokens against the declared
	// rpm/tpm (0 = none) over the fleet-wide sliding minute, atomically. A
	// positive wait means the fleet's window is spent for that long and
	// nothing was counted; an error means the fleet could not answer.
	Reserve(rpm, tpm, tokens int64) (wait time.Duration, err error)
	// ClaimProbe claims a half-open circuit's single probe for the whole
	// fleet: false when another instance holds it; an error means the
	// fleet could not answer.
	ClaimProbe() (bool, error)
	// ReleaseProbe frees a probe claimed by ClaimProbe.
	ReleaseProbe()
	// Spend takes one attempt's share from the fleet's budget: the stated
	// windows of the deployment, one for the whole fleet, spent
	// atomically and full again at their reset. A window the fleet does
	// not hold yet starts as this instance knows it. A positive wait means
	// a window is spent for that long and nothing was taken; else left is
	// what each window holds after the attempt (Remaining and Reset; a
	// window not asked for has Limit provider.Unknown), or holds now when
	// nothing was taken. An error means the fleet could not answer.
	Spend(b Budget) (wait time.Duration, left Budget, err error)
}

// Budget is an attempt's share of a deployment's stated windows, as Spend
// takes it from the fleet.
type Budget struct {
	Requests, Tokens BudgetWindow
	// Instances is how many instances spent the budget lately (Spend's
	// reply): until an instance learns its share of the windows, it
	// counts on an equal one.
	Instances int
	// Unanswered: the fleet could not answer (Spend's error); a bucket
	// then refills on this instance at its share of the rate until the
	// fleet answers again (window.unanswered).
	Unanswered bool
}

// BudgetWindow is one window: its limit (provider.Unknown: not asked),
// what is left and when it is full again as this instance knows it, its
// span (the longest reset stated), and N, the attempt's share (1 request,
// or the tokens the provider is expected to count).
//
// A window that refills continuously (a token bucket: Anthropic's, whose
// reset is the instant it is full again, and an OpenAI-compatible one
// whose statements prove it, PROVIDERS.md) has Rate > 0, in units per
// second: Remaining is its count at the call, Reset when that count has
// refilled to Limit, and Span how long the bucket takes to fill from empty
// (Limit / Rate, at most provider.MaxCooldown). Rate 0 is a fixed window,
// full again at Reset; Fixed says this instance's statements proved it
// one (two of them imply rates no bucket states together): the fleet's
// budget then holds it as a fixed window, whatever another instance read.
type BudgetWindow struct {
	Limit, Remaining int64
	Reset            time.Time
	Span             time.Duration
	N                int64
	Rate             float64
	Fixed            bool
}

func (b Budget) shared() bool { return b.Requests.Limit >= 0 || b.Tokens.Limit >= 0 }

// budgetLocked is the attempt's share of the windows the fleet can hold:
// fixed windows whose limit, reset and span are known, and buckets whose
// limit and rate are.
func (s *State) budgetLocked(now time.Time, tokens int64) Budget {
	return Budget{Requests: s.requests.budget(now, 1), Tokens: s.tokens.budget(now, tokens)}
}

func (w *window) budget(now time.Time, n int64) BudgetWindow {
	cur := w.current(now)
	if w.refilling() && cur >= 0 {
		return BudgetWindow{Limit: w.limit, Remaining: cur, Reset: now.Add(w.fillTime(w.limit - cur)),
			Span: max(w.fillTime(w.limit), time.Millisecond), N: w.expected(n), Rate: w.rate}
	}
	reset := w.nextReset(now)
	if w.limit < 0 || cur < 0 || w.refilling() || reset.IsZero() || w.span <= 0 {
		return BudgetWindow{Limit: provider.Unknown}
	}
	return BudgetWindow{Limit: w.limit, Remaining: cur, Reset: reset, Span: w.span, N: w.expected(n), Fixed: w.fixed}
}

// fillTime is how long a bucket takes to refill n units at its rate, at
// most provider.MaxCooldown.
func (w *window) fillTime(n int64) time.Duration {
	return time.Duration(min(float64(max(n, 0))/w.rate, provider.MaxCooldown.Seconds()) * float64(time.Second))
}

// spentFleet takes what the fleet's budget holds after an attempt as the
// window's count: the whole fleet's spending, not this instance's alone.
// It also learns this instance's share of the fleet's spending (see
// window.share) once a quarter of the window is spent. A bucket's count
// is the fleet's as of now (it refills from there), and the fleet
// answering ends its refill at a share (unanswered).
func (w *window) spentFleet(now time.Time, left BudgetWindow, n int64, instances int) {
	if left.Limit >= 0 && left.Rate > 0 && w.refilling() {
		w.remaining, w.at = min(max(left.Remaining, 0), w.limit), now
		w.offline, w.fleetN = 0, instances
		return
	}
	if left.Limit < 0 || left.Reset.IsZero() || w.refilling() {
		return
	}
	w.offline, w.fleetN = 0, instances // the fleet answers: its count, not a share of a renewal (unanswered)
	equal := 1 / float64(max(instances, 1))
	if w.share == 0 {
		w.share = equal // an equal share, until learned
	}
	if span := max(w.span, left.Span); w.reset.IsZero() || left.Reset.After(w.reset.Add(span/2)) {
		// The fleet's budget rolled the window (leaseScript) before this
		// instance did: a new count, which the old window's last statement
		// is no baseline for, as at a roll here (spend). Its next answer's
		// larger count was read as a refill before the reset, and the
		// window taken for a bucket, which the fleet then leased as one
		// (TestAFleetWindowRollIsNoRefill; trial38: an upstream 429 about
		// 2 s into every window of a fixed 20 per 10 s for 80 s).
		w.stated, w.statedIn = provider.Unknown, [2]time.Duration{}
	}
	// The fleet's count and reset, not this instance's projection: no pace.
	w.remaining, w.reset, w.at, w.projected = max(left.Remaining, 0), left.Reset, now, false
	if !left.Reset.Equal(w.ownReset) {
		w.own, w.ownReset = 0, left.Reset
	}
	w.own += n
	if used := left.Limit - left.Remaining; n > 0 && used >= max(2, left.Limit/4) {
		// What it spent of this window, but no less than an equal share:
		// a forecast that counts too little refuses requests it could
		// serve, one that counts too much only answers them later.
		w.share = min(max(float64(w.own)/float64(used), equal, minShare), 1)
	}
}

// minShare floors an instance's share of the fleet's budget.
const minShare = 0.05

// unanswered notes that the fleet could not answer for the window (Redis
// slow or down, and this instance holds no slice of it): a bucket then
// refills here at this instance's equal share of its rate, among the
// instances that spent it lately, until the fleet answers again
// (spentFleet), so that the instances cut off from Redis do not each
// spend the whole refill. A fixed window goes on as it is known, but
// one that renews before the fleet answers again is this instance's
// equal share of the limit (current), not the whole limit, which each
// cut-off instance would spend at once (trial38: a Redis killed
// mid-burst drew 7-18 upstream 429s when the window renewed during the
// outage). A lone instance goes on as it knows them.
func (w *window) unanswered(now time.Time) {
	if w.offline > 0 || w.fleetN <= 1 {
		return
	}
	if !w.refilling() {
		if w.limit > 0 && !w.reset.IsZero() {
			w.offline = 1 / float64(w.fleetN)
		}
		return
	}
	w.offline = 1 / float64(w.fleetN)
	w.remaining, w.at = w.current(now), now // refilled at the share since the fleet last answered
}

// refillRate is the rate (units per second) a bucket refills at here: its
// rate, or this instance's share of it while the fleet cannot answer.
func (w *window) refillRate() float64 {
	if w.offline > 0 {
		return w.rate * w.offline
	}
	return w.rate
}

// Shared is what fleet mode shares of a State: its circuit and the
// provider-stated windows. Each part carries the instant it was learned
// (At; zero = not included), and the newest learning of each part wins,
// whichever instance it came from.
type Shared struct {
	Circuit  SharedCircuit
	Requests SharedWindow
	Tokens   SharedWindow
	Drain    SharedDrain
}

// SharedDrain is an operator's drain (State.Disable): At when it was set
// or lifted.
type SharedDrain struct {
	At       time.Time
	Disabled bool
}

// SharedCircuit is a circuit breaker's state.
type SharedCircuit struct {
	At        time.Time
	OpenUntil time.Time // zero: closed
	Reason    provider.Class
	// Failures is the count of consecutive failures: above 0 after a
	// failure that is not a rate limit, the circuit turns half-open once
	// OpenUntil passes.
	Failures int
}

// SharedWindow is a provider-stated rate-limit window.
type SharedWindow struct {
	At               time.Time
	Limit, Remaining int64 // provider.Unknown when never stated
	Reset            time.Time
}

// Exhausted reports whether the window says nothing is left at now.
func (w SharedWindow) Exhausted(now time.Time) bool {
	return w.Remaining == 0 && w.Reset.After(now)
}

// fleetLink is a State's side of fleet mode. Its learning instants are kept
// even without a fleet, so that a store bound later (a reload from `store
// memory` to `store redis`) shares what was learned with the right age.
type fleetLink struct {
	// f is the fleet the state talks to: the last one bound. A store is
	// shared by every config that names it (the root's pool), so a reload
	// keeps it; only a reload to another store binds a second one, which
	// takes over (SetFleet). When that one goes away unused (the new config
	// failed to load), the state is unbound until the store still in use
	// takes it back (AdoptFleet, which each store does as it polls).
	f Fleet

	// When each shared part was last learned (here or from the fleet).
	circuitAt, requestsAt, tokensAt, drainAt time.Time

	// reservedUntil: the fleet's declared window was spent when this
	// instance asked; probeElsewhereUntil: another instance holds the
	// half-open probe.
	reservedUntil, probeElsewhereUntil time.Time
	// probeOwned: this instance holds the fleet's probe claim.
	probeOwned bool
}

type circuitPart struct {
	openUntil time.Time
	reason    provider.Class
	failures  int
}

// sharedParts is what Observe may change of the shared parts, read before it
// does.
type sharedParts struct {
	circuit          circuitPart
	requests, tokens window
}

func (s *State) sharedPartsLocked() sharedParts {
	return sharedParts{
		circuit:  circuitPart{s.openUntil, s.openReason, s.consecutiveFailures},
		requests: s.requests,
		tokens:   s.tokens,
	}
}

// shareObserved runs at the end of Observe (deferred, the lock held): it
// dates the parts that the observation changed and publishes them; and it
// frees the fleet's probe claim, since an observation ends the probe.
func (s *State) shareObserved(now time.Time, before sharedParts) {
	l := &s.fleet
	var sh Shared
	if c := (circuitPart{s.openUntil, s.openReason, s.consecutiveFailures}); c != before.circuit {
		l.circuitAt = now
		sh.Circuit = SharedCircuit{At: now, OpenUntil: c.openUntil, Reason: c.reason, Failures: c.failures}
	}
	if s.requests != before.requests {
		l.requestsAt = now
		sh.Requests = s.requests.shared(now)
	}
	if s.tokens != before.tokens {
		l.tokensAt = now
		sh.Tokens = s.tokens.shared(now)
	}
	s.releaseFleetProbeLocked()
	if l.f != nil && (!sh.Circuit.At.IsZero() || !sh.Requests.At.IsZero() || !sh.Tokens.At.IsZero()) {
		l.f.Publish(sh)
	}
}

// unshared is a "before" no state equals (no count is below
// provider.Unknown): shareObserved(now, unshared) dates every part now and
// publishes it, changed or not.
var unshared = sharedParts{circuit: circuitPart{failures: -1},
	requests: window{limit: provider.Unknown - 1}, tokens: window{limit: provider.Unknown - 1}}

func (w window) shared(at time.Time) SharedWindow {
	return SharedWindow{At: at, Limit: w.limit, Remaining: w.remaining, Reset: w.reset}
}

// releaseFleetProbeLocked frees the fleet's probe claim once the local probe
// has ended.
func (s *State) releaseFleetProbeLocked() {
	if s.fleet.probeOwned && !s.probing {
		s.fleet.probeOwned = false
		if s.fleet.f != nil {
			s.fleet.f.ReleaseProbe()
		}
	}
}

// acquireFleet claims, outside the State's lock, what Acquire must claim
// fleet-wide: the half-open probe (probe true; the local probe flag is
// already set) and a place in the declared windows. It returns false when
// the fleet refused, having undone the local probe claim and noted until
// when the deployment is not worth asking for again. When the fleet cannot
// answer, the local decision stands.
func (s *State) acquireFleet(f Fleet, now time.Time, tokens int64, probe bool, rpm, tpm int64, b Budget) (Budget, bool) {
	none := Budget{Requests: BudgetWindow{Limit: provider.Unknown}, Tokens: BudgetWindow{Limit: provider.Unknown}}
	owned := false
	if probe {
		ok, err := f.ClaimProbe()
		if err == nil && !ok {
			s.lock()
			s.probing = false
			s.fleet.probeElsewhereUntil = now.Add(probeWait)
			s.mu.Unlock()
			return none, false
		}
		owned = err == nil
	}
	refuse := func(wait time.Duration, left Budget) (Budget, bool) {
		s.lock()
		if probe {
			s.probing = false
		}
		s.requests.spentFleet(now, left.Requests, 0, left.Instances) // what the fleet holds
		s.tokens.spentFleet(now, left.Tokens, 0, left.Instances)
		s.fleet.reservedUntil = now.Add(wait)
		s.mu.Unlock()
		if owned {
			f.ReleaseProbe()
		}
		return none, false
	}
	left := none
	if b.shared() {
		wait, l, err := f.Spend(b)
		if err == nil && wait > 0 {
			return refuse(wait, l)
		}
		if err == nil {
			left = l
		} else {
			left.Unanswered = true
		}
	}
	if rpm > 0 || tpm > 0 {
		if wait, err := f.Reserve(rpm, tpm, tokens); err == nil && wait > 0 {
			return refuse(wait, left)
		}
	}
	if owned {
		s.lock()
		s.fleet.probeOwned = true
		s.releaseFleetProbeLocked() // the probe may have ended meanwhile
		s.mu.Unlock()
	}
	return left, true
}

// SetFleet binds the state to a fleet store, until ClearFleet(f) or
// another SetFleet. It publishes what the state already knows, each part
// with the instant it was learned, so that newer knowledge elsewhere is not
// overwritten.
func (s *State) SetFleet(f Fleet) {
	s.lock()
	defer s.mu.Unlock()
	s.bindLocked(f)
}

// AdoptFleet is SetFleet for a state that no fleet holds; it reports
// whether it bound the state.
func (s *State) AdoptFleet(f Fleet) bool {
	s.lock()
	defer s.mu.Unlock()
	if s.fleet.f != nil {
		return false
	}
	s.bindLocked(f)
	return true
}

func (s *State) bindLocked(f Fleet) {
	s.fleet.f = f
	s.fleet.probeOwned = false // a claim made through another store is that store's to free
	if sh := s.sharedLocked(); !sh.Circuit.At.IsZero() || !sh.Requests.At.IsZero() || !sh.Tokens.At.IsZero() {
		f.Publish(sh)
	}
}

// ClearFleet unbinds the state from f, if f holds it; the state goes on
// with its own knowledge.
func (s *State) ClearFleet(f Fleet) {
	s.lock()
	defer s.mu.Unlock()
	if s.fleet.f == f {
		s.fleet.f = nil
		s.fleet.probeOwned = false
	}
}

// Shared returns the shared parts as known here, each with the instant it
// was learned (zero At: never learned).
func (s *State) Shared() Shared {
	s.lock()
	defer s.mu.Unlock()
	return s.sharedLocked()
}

func (s *State) sharedLocked() Shared {
	var sh Shared
	if at := s.fleet.circuitAt; !at.IsZero() {
		sh.Circuit = SharedCircuit{At: at, OpenUntil: s.openUntil, Reason: s.openReason, Failures: s.consecutiveFailures}
	}
	if at := s.fleet.requestsAt; !at.IsZero() {
		sh.Requests = s.requests.shared(at)
	}
	if at := s.fleet.tokensAt; !at.IsZero() {
		sh.Tokens = s.tokens.shared(at)
	}
	if at := s.fleet.drainAt; !at.IsZero() {
		sh.Drain = SharedDrain{At: at, Disabled: s.disabled}
	}
	return sh
}

// Merge folds what another instance learned into the state: each part
// learned later than what is known here replaces it. It reports whether
// anything changed.
func (s *State) Merge(sh Shared) bool {
	s.lock()
	defer s.mu.Unlock()
	changed := false
	if c := sh.Circuit; c.At.After(s.fleet.circuitAt) {
		s.fleet.circuitAt = c.At
		s.openUntil, s.openReason, s.consecutiveFailures = c.OpenUntil, c.Reason, max(c.Failures, 0)
		changed = true
	}
	merge := func(w SharedWindow, dst *window, at *time.Time) {
		if w.At.After(*at) {
			*at = w.At
			dst.limit, dst.remaining, dst.reset, dst.projected = w.Limit, w.Remaining, w.Reset, false
			// Another instance's count is no statement of this one's: the
			// attempts it had in flight, which this instance does not
			// count, lie between it and this instance's next answer, so
			// that a larger count then is no refill (nor a drop the
			// attempt's cost): refills, rates and ratios compare this
			// instance's own statements only.
			dst.stated, dst.at = provider.Unknown, w.At
			if w.Reset.After(w.At) {
				dst.span = max(dst.span, min(w.Reset.Sub(w.At), provider.MaxCooldown))
			}
			changed = true
		}
	}
	merge(sh.Requests, &s.requests, &s.fleet.requestsAt)
	merge(sh.Tokens, &s.tokens, &s.fleet.tokensAt)
	if d := sh.Drain; d.At.After(s.fleet.drainAt) {
		s.fleet.drainAt, s.disabled = d.At, d.Disabled
		changed = true
	}
	return changed
}

// DeclaredWindow is the span of the declared rpm and tpm: a sliding minute.
// A fleet store counts its fleet-wide windows over the same span.
const DeclaredWindow = declaredWindow
