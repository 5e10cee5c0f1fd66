package capacity

import (
	"github.com/llmrouter/caddy-llm-router/provider"

	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Circuit is a deployment's availability as a breaker sees it.
type Circuit uint8

const (
	// Closed: usable.
	Closed Circuit = iota
	// HalfOpen: a failure's cooldown has passed; one probe may go through.
	HalfOpen
	// Open: skipped until an instant.
	Open
)

// String returns the circuit's name: "closed", "half_open" or "open".
func (c Circuit) String() string {
	switch c {
	case HalfOpen:
		return "half_open"
	case Open:
		return "open"
	}
	return "closed"
}

// MarshalText writes the circuit's name, so that JSON shows "open".
func (c Circuit) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// Health decays with a half-life, so that a deployment that failed an hour
// ago is not judged by it forever.
const healthHalfLife = 5 * time.Minute

// ewmaWeight is the weight of a new latency sample.
const ewmaWeight = 0.3

// probeWait is how long others wait while a half-open circuit's probe is out.
const probeWait = time.Second

// State is what is known about one deployment: its rate-limit windows (as
// the provider stated them, and as declared by the operator), its circuit,
// and its health (latency and success rate). It is safe for concurrent use.
// A State outlives a config reload when kept in a caddy.UsagePool (it
// implements caddy.Destructor).
type State struct {
	mu sync.Mutex
	// view is a copy of the core as it stood when last read (nil after
	// any change: lock clears it), so that ranking reads it without the
	// lock (ReadFeaturesFor); nil too while the core cannot be read from
	// a copy (viewable).
	view atomic.Pointer[core]
	// readAgain: the core was read since its last change, without a view
	// published (the first read takes the lock: a deployment changed by
	// every request, the only one of its group, costs no copy per request).
	readAgain bool
	// ledger: what its answers used and cost, its failovers (kept out of
	// the core: the ranking does not read it, and it is large to copy).
	ledger ledger
	core
}

// core is the part of a State that the ranking reads (readFeatures and what
// it calls), with what changes along with it. Its methods read it without
// changing it, so that a copy answers them as the State would.
type core struct {
	requests, tokens window
	// counts is what the token window counts of an attempt, as its last
	// statement said (windowTokens); cache is the provider's prompt cache
	// as its answers reported it (cache.go).
	counts provider.Counts
	cache  map[uint64]cachedPrefix
	// charged is what the token window was charged of the attempts sent
	// lately per unit of their estimate (windowTokens / Need.Tokens, an
	// EWMA; 0 until one is sent): Forecast's tokens are in the estimate's
	// units, as the queue counts its waiting requests.
	charged float64

	openUntil           time.Time
	openReason          provider.Class
	consecutiveFailures int
	probing             bool
	inFlight            int

	// seq numbers the attempts in the order they were sent; flights are
	// those in flight, oldest first: what an answer cannot have counted.
	seq     uint64
	flights []flight
	// sentTokens sums the token estimates of every attempt sent.
	sentTokens int64
	// failSeq is the last attempt sent when the last failure was seen: a
	// failure of an attempt sent before that belongs to the same event
	// (one outage, one spent window) and counts once.
	failSeq uint64
	// recoveredSeq is the probe whose success closed the last outage: a
	// server failure of an attempt sent before it is a late answer of that
	// outage, already paid for by its cooldown.
	recoveredSeq uint64
	// answered: an answer came, so that slow start is over.
	answered bool
	// disabled: an operator took the deployment out (Disable).
	disabled bool
	// capped: the token window's limit bounds what one request may ask
	// (FitsTokens), as its provider type stated (Window.BoundsRequest) or
	// a too_large answer showed; a limit alone does not, since a window
	// may count less than prompt plus max_tokens. uncapped: an attempt
	// estimated above the limit was answered, so the window does not
	// count the estimate (an OpenAI-compatible server that counts what
	// answers used, as llm_mock does), whatever its type says; until a
	// too_large answer says otherwise.
	capped, uncapped bool

	lastClass   provider.Class
	lastAt      time.Time
	lastMessage string

	// Health: EWMAs in seconds (0 = no sample yet) and a success rate
	// decayed by time.
	latency, ttft       float64
	successes, attempts float64
	healthAt            time.Time
	// failedRun counts the failed attempts since the last success (decayed
	// like attempts): an outage's, which a probe's success forgives.
	failedRun float64

	// picks counts recent attempts (decayed like health), so that equal
	// deployments share traffic evenly rather than at random.
	picks   float64
	picksAt time.Time

	declared declared

	// budgetUntil: its budget is spent until then (BudgetSpent).
	budgetUntil time.Time

	// fleet is the state's side of fleet mode (fleet.go).
	fleet fleetLink
}

// NewState returns a State with nothing known.
func NewState() *State {
	return &State{core: core{
		requests: window{limit: provider.Unknown, remaining: provider.Unknown, stated: provider.Unknown},
		tokens:   window{limit: provider.Unknown, remaining: provider.Unknown, stated: provider.Unknown},
	}}
}

// Destruct implements caddy.Destructor; a State holds no resources.
func (s *State) Destruct() error { return nil }

// Declare sets the operator's declared limits (requests and tokens per
// minute; 0 = none), enforced locally over a sliding minute whatever the
// provider says: the only protection for providers that send no headers.
func (s *State) Declare(rpm, tpm int64) {
	s.lock()
	defer s.mu.Unlock()
	s.declared.rpm, s.declared.tpm = rpm, tpm
}

// Observed is what Observe changed.
type Observed struct {
	// Cooldown is how long the deployment is now avoided (0: usable).
	Cooldown time.Duration
	// Opened is true when this observation opened a circuit that was not
	// open for the same reason: the moment to log it once.
	Opened bool
	// Learned is true when this observation made the deployment's
	// capacity known: the first statement of a window's limit, or the
	// first answer, which ends slow start; or proved what a window is
	// (a bucket, a fixed window: its form). Forecasts that could not
	// tell before may now.
	Learned bool
}

// Observe folds one attempt's outcome, seen at now, into the state.
func (s *State) Observe(now time.Time, o provider.Observation, p Policy) Observed {
	s.lock()
	a := Attempt{Sent: now, seq: s.seq} // after every attempt sent so far
	s.mu.Unlock()
	return s.observe(a, true, now, o, p)
}

// ObserveAttempt is Observe for the answer to attempt a (AcquireAttempt).
// A success speaks only for when a was sent: one sent before the circuit
// opened or a window was last stated, as this instance or the fleet
// learned it (a request admitted just before a 429, answered after it),
// closes no circuit and changes no window; it still counts toward health.
// A failure speaks for when it was observed. Only the probe's own answer
// ends a half-open circuit's probe.
func (s *State) ObserveAttempt(a Attempt, now time.Time, o provider.Observation, p Policy) Observed {
	return s.observe(a, false, now, o, p)
}

// observe is Observe (anyAttempt: the answer's attempt is not known, so it
// ends any probe) and ObserveAttempt.
func (s *State) observe(a Attempt, anyAttempt bool, now time.Time, o provider.Observation, p Policy) (out Observed) {
	s.lock()
	defer s.mu.Unlock()
	learned := now
	if o.Class == provider.OK && a.Sent.Before(now) {
		learned = a.Sent
	}
	// Fleet mode: publish what this observation changes (fleet.go).
	defer s.shareObserved(learned, s.sharedPartsLocked())
	knew := s.requests.limit >= 0 || s.tokens.limit >= 0 || !s.slowStarting()
	forms := [2]form{s.requests.form(), s.tokens.form()}
	defer func() {
		if !knew && (s.requests.limit >= 0 || s.tokens.limit >= 0 || !s.slowStarting()) ||
			forms != [2]form{s.requests.form(), s.tokens.form()} {
			out.Learned = true
		}
	}()
	if o.Class == provider.RateLimited {
		// Refused where the router believed the window had room (it took
		// the stated window to be full again): it may round its resets.
		if a.Requests > 0 {
			s.requests.learnRounded(o.Requests.Resolution)
		}
		if a.Tokens > 0 {
			s.tokens.learnRounded(o.Tokens.Resolution)
		}
	}
	// What every statement says of a bucket's rate, stale or not.
	s.requests.noteStatement(now, a.Sent, o.Requests)
	s.tokens.noteStatement(now, a.Sent, o.Tokens)
	sinceRequests, sinceTokens := s.countedSince(a)
	s.observeWindow(&s.requests, s.fleet.requestsAt, a, o.Class, o.Requests, sinceRequests, 1, learned, now)
	if o.Tokens != provider.UnknownWindow {
		s.counts = o.Tokens.Counts
	}
	s.observeWindow(&s.tokens, s.fleet.tokensAt, a, o.Class, o.Tokens, sinceTokens, a.tokens, learned, now)
	if o.Class == provider.OK || o.Requests.Limit >= 0 || o.Tokens.Limit >= 0 {
		s.answered = true
	}
	s.lastClass, s.lastAt = o.Class, now
	switch {
	case o.Class == provider.TooLarge:
		s.capped, s.uncapped = true, false
	case o.Class == provider.OK && s.tokens.limit > 0 && a.tokens > s.tokens.limit:
		s.uncapped = true
	}
	s.capped = s.capped || o.Tokens.BoundsRequest
	probe := s.probing && (a.Probe || anyAttempt) // this answers the half-open circuit's probe
	if probe {
		s.probing = false
	}
	if !anyAttempt && a.seq < s.recoveredSeq && o.Class.Transient() && o.Class != provider.RateLimited {
		// Sent before the probe that proved the deployment back: neither
		// its circuit nor its reliability hear of it again.
		return Observed{}
	}
	if o.Class == provider.OK || o.Class.Failure() {
		s.decayHealth(now)
		s.attempts++
		if o.Class == provider.OK {
			s.successes++
		} else {
			s.failedRun++
		}
	}
	if !o.Class.Failure() {
		if o.Class == provider.OK && !learned.Before(s.fleet.circuitAt) {
			if probe {
				// A probe proved the deployment back: the failures that
				// opened the circuit were paid for by its cooldown, and
				// no longer hold its reliability down. All of them: a
				// burst's attempts in flight fail as one event (one
				// consecutive failure) but each counted as an attempt.
				s.attempts = max(s.attempts-s.failedRun, s.successes)
				s.recoveredSeq = a.seq
			}
			s.consecutiveFailures, s.failedRun = 0, 0
			// A success proves the circuit closed, whatever opened it
			// before the success was sent.
			s.openUntil = time.Time{}
		}
		// Exhausted windows are read by AvailableAt; no circuit to open.
		return Observed{Cooldown: p.Cooldown(o, 0)}
	}
	// Failures of attempts that were in flight when the last failure was
	// seen are the same event: they extend its wait, not its count.
	if anyAttempt || s.consecutiveFailures == 0 || a.seq > s.failSeq {
		s.consecutiveFailures++
	}
	s.failSeq = s.seq
	s.lastMessage = o.Message
	cool := p.Cooldown(o, s.consecutiveFailures)
	res := Observed{Cooldown: cool}
	if until := now.Add(cool); cool > 0 && until.After(s.openUntil) {
		res.Opened = !s.openUntil.After(now) || s.openReason != o.Class
		s.openUntil, s.openReason = until, o.Class
	}
	return res
}

// observeWindow folds what an answer of class c stated of window w (ow)
// into it, unless the answer is stale for it (staleForWindow): then only
// what it says of the provider's window (noteStale: a bucket, rounding).
func (s *State) observeWindow(w *window, learnedAt time.Time, a Attempt, c provider.Class, ow provider.Window, since, estimate int64, learned, now time.Time) {
	if c == provider.OK && s.staleForWindow(w, learnedAt, a.seq, learned, now) {
		w.noteStale(now, a.Sent, ow)
		return
	}
	w.update(now, a.Sent, ow, since, estimate)
	w.seq = max(w.seq, a.seq)
}

// staleForWindow reports whether a success to attempt seq, learned at
// learned, is older than what was last stated of w (by a later attempt's
// answer, or learnedAt in the fleet), while it still holds: it must not
// change it (a stale "50 left" would refill a window now at 2).
func (s *State) staleForWindow(w *window, learnedAt time.Time, seq uint64, learned, now time.Time) bool {
	return w.current(now) >= 0 && (learned.Before(learnedAt) || seq < w.seq)
}

// flight is an attempt in flight: its sequence number and token estimate.
type flight struct {
	seq    uint64
	tokens int64
	// sentTokens is State.sentTokens before the attempt was sent.
	sentTokens int64
}

// countedSince returns how many attempts other than a, and of how many
// tokens, the provider may have counted after it answered a: those in
// flight when a was sent and those sent since.
func (s *State) countedSince(a Attempt) (requests, tokens int64) {
	if a.seq == 0 || a.oldest == 0 {
		return 0, 0
	}
	requests = int64(s.seq - a.oldest) // [oldest, s.seq] less a
	tokens = s.sentTokens - a.oldestSentTokens - a.tokens
	return max(requests, 0), max(tokens, 0)
}

// RecordLatency folds a successful attempt's latencies into the EWMAs:
// total until the answer was complete (non-streaming) and ttft until the
// first content event (streaming); a zero duration is no sample.
func (s *State) RecordLatency(total, ttft time.Duration) {
	s.lock()
	defer s.mu.Unlock()
	if total > 0 {
		s.latency = ewma(s.latency, total.Seconds())
	}
	if ttft > 0 {
		s.ttft = ewma(s.ttft, ttft.Seconds())
	}
}

// RecordAtLeast folds in a censored sample: an attempt cancelled before it
// answered (a timeout, the deadline) took at least total (non-streaming)
// or ttft (streaming, to its first content) without answering. It raises
// an EWMA below it as a sample would, and leaves one above it alone (the
// deployment is known to be at least that slow, not faster than
// believed); a zero duration is no sample. One hang of a deployment that
// usually answers moves it only so far: raised to a 15 s timeout, it
// looked too slow for every deadline left, and the next attempt (a
// resume, on the only deployment) was not made.
func (s *State) RecordAtLeast(total, ttft time.Duration) {
	s.lock()
	defer s.mu.Unlock()
	if sec := total.Seconds(); total > 0 && sec > s.latency {
		s.latency = ewma(s.latency, sec)
	}
	if sec := ttft.Seconds(); ttft > 0 && sec > s.ttft {
		s.ttft = ewma(s.ttft, sec)
	}
}

// RecordLostHedge folds in the attempt of a hedged pair that the other
// attempt won: it ran total (non-streaming) or ttft (streaming, to its
// first content) without answering while a peer answered. The deployment
// is at least that slow now, slower than the peer: an EWMA below it is
// raised to it, one above it is left alone. Folded in as one sample of
// weight 0.3 (RecordAtLeast), the record of a deployment turned slow
// stayed below what every lost hedge proved, within a near tie of its
// faster peer, which kept choosing it first and hedging every request.
func (s *State) RecordLostHedge(total, ttft time.Duration) {
	s.lock()
	defer s.mu.Unlock()
	s.latency = max(s.latency, total.Seconds())
	s.ttft = max(s.ttft, ttft.Seconds())
}

func ewma(old, sample float64) float64 {
	if old == 0 {
		return sample
	}
	return old + ewmaWeight*(sample-old)
}

func (s *core) recentPicks(now time.Time) float64 {
	if s.picksAt.IsZero() || !now.After(s.picksAt) {
		return s.picks
	}
	return s.picks * math.Exp2(-float64(now.Sub(s.picksAt))/float64(healthHalfLife))
}

func (s *State) decayHealth(now time.Time) {
	if !s.healthAt.IsZero() && now.After(s.healthAt) {
		f := math.Exp2(-float64(now.Sub(s.healthAt)) / float64(healthHalfLife))
		s.successes *= f
		s.attempts *= f
		s.failedRun *= f
	}
	s.healthAt = now
}

// circuit reads the breaker at now. A rate-limit circuit closes at its
// reset; any other failure's circuit turns half-open when its cooldown ends
// and closes on the next success.
func (s *core) circuit(now time.Time) Circuit {
	switch {
	case s.openUntil.After(now):
		return Open
	case !s.openUntil.IsZero() && s.openReason != provider.RateLimited && s.consecutiveFailures > 0:
		return HalfOpen
	}
	return Closed
}

// SlowStart is how many attempts a deployment that never answered may
// have in flight: while its limits are unknown, a burst does not flood it.
// Its first answer ends slow start: the windows it states (or the declared
// rpm/tpm) apply from then on, and a deployment that states none (a local
// vLLM or Ollama) takes any concurrency.
const SlowStart = 4

// slowStartWait is how long a request waits for a slow-starting
// deployment's first answer before it looks again (the router also looks
// again as soon as an attempt ends).
const slowStartWait = 100 * time.Millisecond

// Need is what one attempt asks of a deployment.
type Need struct {
	// Tokens is the attempt's size in tokens: prompt plus max_tokens.
	Tokens int64
	// Output is its max_tokens (0: not set), for a window that counts
	// input or output alone (provider.Counts).
	Output int64
	// Prefixes are stable hashes of the request's prompt up to the ends of
	// its cacheable parts, shortest first, the last one the request's
	// whole cache prefix (router.Request.CachePrefixes): what the
	// deployment reported held in its prompt cache for the longest of them
	// it remembers is predicted read from the cache (RecordCache).
	Prefixes []uint64
	// Reserve is the share of each known window (0..1) the attempt must
	// leave unspent: capacity kept for requests of higher priority.
	Reserve float64
}

// AvailableAt returns when the deployment may next be tried by a request of
// about tokens tokens (prompt plus max_tokens), and why it waits: a time not
// after now means "at once". It waits for an open circuit, a half-open one
// whose probe is out, a stated window without a unit (or tokens) left until
// it is full again or has refilled enough, the declared rpm/tpm, and slow
// start.
func (s *State) AvailableAt(now time.Time, tokens int64) (time.Time, provider.Class) {
	return s.AvailableFor(now, Need{Tokens: tokens})
}

// FitsTokens reports whether an attempt of about tokens tokens (prompt
// plus max_tokens, the estimate providers admit on) can ever fit the
// provider-stated token window, with the window's whole limit
// (provider.Unknown when none is stated: then it fits). It does not when
// it is larger than the limit of a window known to bound one request (its
// provider type says so, provider.Window.BoundsRequest, or a request was
// refused as larger than it, provider.TooLarge: OpenAI's 429 "Request too
// large"): no wait lets it through there, while smaller attempts go. A
// limit not known to bound a request refuses nothing (a window may count
// less than prompt plus max_tokens: Anthropic's output tokens).
func (s *State) FitsTokens(tokens int64) (bool, int64) {
	s.mu.Lock() // a read: the view stays
	defer s.mu.Unlock()
	return s.fitsTokens(tokens), s.tokens.limit
}

// fitsTokens compares the estimate itself, not what a learned ratio
// expects the window to count: a ratio learned from small answers of a
// refilling window says nothing of admission.
func (s *core) fitsTokens(tokens int64) bool {
	return !s.capped || s.uncapped || s.tokens.limit <= 0 || tokens <= s.tokens.limit
}

// AvailableFor is AvailableAt for an attempt that must leave a reserve.
func (s *State) AvailableFor(now time.Time, n Need) (time.Time, provider.Class) {
	s.lock()
	defer s.mu.Unlock()
	return s.availableAt(now, n)
}

func (s *State) availableAt(now time.Time, n Need) (time.Time, provider.Class) {
	return s.availableAtCur(now, n, s.requests.current(now), s.tokens.current(now))
}

// availableAtCur is availableAt with the windows' current counts at now.
func (s *core) availableAtCur(now time.Time, n Need, requests, tokens int64) (time.Time, provider.Class) {
	return s.availableAtWith(now, n, requests, tokens, s.circuit(now), s.windowTokens(now, n))
}

// availableAtWith is availableAtCur with the circuit at now and what the
// token window counts of the attempt (windowTokens), for a caller that
// reads them too.
func (s *core) availableAtWith(now time.Time, n Need, requests, tokens int64, c Circuit, counted int64) (time.Time, provider.Class) {
	at, why := now, provider.OK
	if s.budgetUntil.After(now) {
		// Its budget is spent (Spent): out as a spent quota until it renews.
		at, why = s.budgetUntil, provider.QuotaExhausted
	}
	switch c {
	case Open:
		at, why = s.openUntil, s.openReason
	case HalfOpen:
		// Fleet mode: the probe may be out on another instance (fleet.go).
		if s.probing || s.fleet.probeElsewhereUntil.After(now) {
			at, why = now.Add(probeWait), s.openReason
		}
	}
	if t := s.requests.availableAtCur(now, requests, 1, n.Reserve); t.After(at) {
		at, why = t, provider.RateLimited
	}
	if t := s.tokens.availableAtCur(now, tokens, counted, n.Reserve); t.After(at) {
		at, why = t, provider.RateLimited
	}
	if t := s.declared.availableAt(now, n.Tokens, n.Reserve); t.After(at) {
		at, why = t, provider.RateLimited
	}
	// Fleet mode: the fleet-wide declared window was spent (fleet.go).
	if t := s.fleet.reservedUntil; t.After(at) {
		at, why = t, provider.RateLimited
	}
	if s.inFlight >= SlowStart && s.slowStarting() {
		// Busy, not limited: the router's own pacing (why stays OK when
		// nothing else holds the deployment back).
		if t := now.Add(slowStartWait); t.After(at) {
			at = t
		}
	}
	return at, why
}

// slowStarting reports whether the deployment never answered and nothing
// bounds it yet.
func (s *core) slowStarting() bool {
	return !s.answered && s.requests.limit < 0 && s.tokens.limit < 0 && !s.declared.active()
}

// Forecast returns how many attempts, and of how many tokens, the
// deployment's known windows (stated and declared) let start from now until
// until, leaving need's reserve unspent: provider.Unknown for a count that
// nothing known bounds. A circuit open past until lets none start.
func (s *State) Forecast(now, until time.Time, reserve float64) (requests, tokens int64) {
	return s.forecast(now, until, reserve, false)
}

// ForecastFleet is Forecast for the whole fleet: in fleet mode, all of the
// fleet's windows rather than this instance's share of them (for a place
// in a queue counted fleet-wide).
func (s *State) ForecastFleet(now, until time.Time, reserve float64) (requests, tokens int64) {
	return s.forecast(now, until, reserve, true)
}

func (s *State) forecast(now, until time.Time, reserve float64, whole bool) (requests, tokens int64) {
	s.lock()
	defer s.mu.Unlock()
	if s.circuit(now) == Open && !s.openUntil.Before(until) {
		return 0, 0
	}
	least := func(a, b int64) int64 {
		switch {
		case a < 0:
			return b
		case b < 0:
			return a
		}
		return min(a, b)
	}
	rpm, tpm := s.declared.forecast(now, until, reserve)
	requests = least(s.requests.forecast(now, until, reserve, whole), rpm)
	tokens = least(s.perEstimate(s.tokens.forecastUnits(now, until, reserve, whole)), tpm)
	return requests, tokens
}

// Features is what ranking needs of a deployment, read under one lock.
type Features struct {
	// At is when the deployment may be tried (see AvailableAt), Why the reason
	// it waits.
	At  time.Time
	Why provider.Class
	// Probe: the circuit is half-open and its single probe is free; the
	// router sends the next request to it whatever the ranking says, so
	// that a deployment that recovered is found (see State.circuit).
	Probe bool
	// Disabled: an operator took the deployment out (State.Disable); the
	// router does not try it.
	Disabled bool
	// TooLarge: the request is larger than the stated token window's whole
	// limit (see FitsTokens); no wait lets it through.
	TooLarge bool
	// Headroom is the smallest of remaining/limit over the known windows
	// (provider-stated and declared), after this request's tokens; provider.Unknown
	// (-1) when no window is known.
	Headroom float64
	// Latency is the EWMA of TTFT (streaming) or total latency
	// (non-streaming), in seconds; 0 when never measured.
	Latency float64
	// Reliability is the time-decayed success rate with one virtual success
	// as prior, 0..1: a deployment never tried counts as reliable.
	Reliability float64
	// InFlight is the number of attempts under way.
	InFlight int
	// Load is InFlight plus the recent attempts, decayed with a 5-minute
	// half-life: how much of the traffic this deployment has had lately.
	Load float64
}

// Features reads the ranking features at now for a request of about
// tokens tokens.
func (s *State) Features(now time.Time, tokens int64, stream bool) Features {
	var f Features
	s.ReadFeatures(&f, now, tokens, stream)
	return f
}

// ReadFeatures is Features into f, for callers that rank in place.
func (s *State) ReadFeatures(f *Features, now time.Time, tokens int64, stream bool) {
	s.ReadFeaturesFor(f, now, Need{Tokens: tokens}, stream)
}

// ReadFeaturesFor is ReadFeatures for an attempt that must leave a reserve.
// It takes no lock while the state is unchanged since it was read twice
// (State.view): the ranking reads each deployment of a group per attempt.
func (s *State) ReadFeaturesFor(f *Features, now time.Time, n Need, stream bool) {
	if v := s.view.Load(); v != nil {
		v.readFeatures(f, now, n, stream)
		return
	}
	s.mu.Lock()
	if s.readAgain && s.viewable() {
		v := new(core)
		*v = s.core
		s.view.Store(v)
	}
	s.readAgain = true
	s.readFeatures(f, now, n, stream)
	s.mu.Unlock()
}

// lock takes the state's lock for a change (or a read that may change
// it, such as the declared window's pruning), so that no reader reads the
// view of before it. A read that changes nothing (Disabled, FitsTokens)
// takes s.mu itself and keeps the view.
func (s *State) lock() {
	s.mu.Lock()
	s.readAgain = false
	if s.view.Load() != nil {
		s.view.Store(nil)
	}
}

// viewable reports whether a copy of the core reads as the core would
// (State.view): not while the declared windows are kept (their reads
// prune the log, shared with the copy) or the token window counts what the
// prompt cache holds (a map, shared with the copy too).
func (s *State) viewable() bool {
	cached := s.counts == provider.CountsUncached || s.counts == provider.CountsUncachedInput
	return !s.declared.active() && !(cached && s.cache != nil)
}

func (s *core) readFeatures(f *Features, now time.Time, n Need, stream bool) {
	tokens := n.Tokens
	rq, tk := s.requests.current(now), s.tokens.current(now)
	c, counted := s.circuit(now), s.windowTokens(now, n)
	*f = Features{Headroom: provider.Unknown, InFlight: s.inFlight, Disabled: s.disabled, TooLarge: !s.fitsTokens(tokens)}
	f.At, f.Why = s.availableAtWith(now, n, rq, tk, c, counted)
	f.Probe = !f.At.After(now) && c == HalfOpen // half-open: after failures
	if stream && s.ttft > 0 {
		f.Latency = s.ttft
	} else {
		f.Latency = s.latency
	}
	decay := 1.0
	if !s.healthAt.IsZero() && now.After(s.healthAt) {
		decay = math.Exp2(-float64(now.Sub(s.healthAt)) / float64(healthHalfLife))
	}
	f.Reliability = (s.successes*decay + 1) / (s.attempts*decay + 1)
	f.Load = float64(s.inFlight) + s.recentPicks(now)
	// What would be left after this request, as a share of the limit.
	headroom := func(left, limit int64) {
		if limit <= 0 {
			return
		}
		h := min(max(float64(left)/float64(limit), 0), 1)
		if f.Headroom >= 0 {
			h = min(h, f.Headroom)
		}
		f.Headroom = h
	}
	if rq >= 0 {
		headroom(rq-1, s.requests.limit)
	}
	if tk >= 0 {
		headroom(tk-counted, s.tokens.limit)
	}
	if s.declared.rpm > 0 {
		headroom(s.declared.rpm-s.declared.requestsIn(now)-1, s.declared.rpm)
	}
	if s.declared.tpm > 0 {
		headroom(s.declared.tpm-s.declared.tokensIn(now)-tokens, s.declared.tpm)
	}
}

// Acquire claims the deployment for one attempt at now of about tokens
// tokens: it counts the attempt in flight and in the declared windows, and
// spends it from the provider-stated windows until the next response says
// more. It returns false when a half-open circuit's single probe is already
// out, or when the deployment is no longer free at now (another request
// took the last slot of a window): pick again. Every successful Acquire is
// paired with one Release.
func (s *State) Acquire(now time.Time, tokens int64) bool {
	_, ok := s.AcquireAttempt(now, tokens)
	return ok
}

// AcquireAttempt is Acquire for an attempt sent at now: the Attempt it
// returns says whether it is the half-open circuit's probe, and is handed
// back to ObserveAttempt and ReleaseAttempt, so that only the probe's own
// answer ends the probe.
func (s *State) AcquireAttempt(now time.Time, tokens int64) (Attempt, bool) {
	return s.AcquireFor(now, Need{Tokens: tokens})
}

// AcquireFor is AcquireAttempt for an attempt that must leave a reserve.
func (s *State) AcquireFor(now time.Time, n Need) (Attempt, bool) {
	tokens := n.Tokens
	s.lock()
	// Check again under the lock: requests that saw the deployment free at
	// the same instant must not all take the last slot of a window.
	if at, _ := s.availableAt(now, n); at.After(now) {
		s.mu.Unlock()
		return Attempt{}, false
	}
	probe := s.circuit(now) == HalfOpen
	if probe {
		if s.probing {
			s.mu.Unlock()
			return Attempt{}, false
		}
		s.probing = true
	}
	// Fleet mode (fleet.go): the probe and the declared windows are claimed
	// fleet-wide too, outside the lock, so that no request waits on another
	// one's round trip to the store.
	var spent Budget                  // what the fleet's budget holds after this attempt
	counted := s.windowTokens(now, n) // what the stated token window counts of it
	s.learnCharged(counted, n.Tokens)
	if f := s.fleet.f; f != nil {
		b := s.budgetLocked(now, counted)
		if probe || s.declared.active() || b.shared() {
			rpm, tpm := s.declared.rpm, s.declared.tpm
			s.mu.Unlock()
			var ok bool
			if spent, ok = s.acquireFleet(f, now, tokens, probe, rpm, tpm, b); !ok {
				return Attempt{}, false // it freed the probe and noted when to ask again
			}
			s.lock()
		}
	}
	defer s.mu.Unlock()
	s.inFlight++
	s.picks = s.recentPicks(now) + 1
	s.picksAt = now
	if spent.Unanswered {
		s.requests.unanswered(now)
		s.tokens.unanswered(now)
	}
	a := Attempt{Sent: now, Probe: probe, Requests: s.requests.current(now), Tokens: s.tokens.current(now)}
	s.requests.spend(now, 1)
	s.tokens.spend(now, counted)
	s.requests.spentFleet(now, spent.Requests, 1, spent.Instances)
	s.tokens.spentFleet(now, spent.Tokens, s.tokens.expected(counted), spent.Instances)
	s.declared.record(now, tokens)
	s.seq++
	a.seq, a.tokens = s.seq, max(counted, 0)
	s.flights = append(s.flights, flight{seq: s.seq, tokens: a.tokens, sentTokens: s.sentTokens})
	a.oldest, a.oldestSentTokens = s.flights[0].seq, s.flights[0].sentTokens
	s.sentTokens += a.tokens
	return a, true
}

// Attempt is one request Acquire let through to the deployment: when it
// was sent, whether it is the half-open circuit's probe, and the budget the
// router believed was left when it sent it.
type Attempt struct {
	Sent  time.Time
	Probe bool
	// Requests and Tokens are what the stated windows held before the
	// attempt spent its share (provider.Unknown when not known): what the
	// router believed when an unpredicted 429 answers it.
	Requests, Tokens int64

	seq, oldest      uint64 // this attempt's number, and the oldest in flight when it was sent
	tokens           int64  // its token estimate
	oldestSentTokens int64  // State.sentTokens when the oldest was sent
}

// Release ends an attempt claimed by Acquire (and frees a probe that ended
// without an Observe, such as a client that went away).
func (s *State) Release() { s.release(Attempt{Probe: true}) }

// ReleaseAttempt is Release for attempt a: it frees the probe only if a
// is the probe.
func (s *State) ReleaseAttempt(a Attempt) { s.release(a) }

func (s *State) release(a Attempt) {
	s.lock()
	defer s.mu.Unlock()
	if s.inFlight > 0 {
		s.inFlight--
	}
	if s.inFlight == 0 {
		s.requests.unhold() // nothing left to state a holding window
		s.tokens.unhold()
	}
	if a.Probe {
		s.probing = false
	}
	// The attempt is no longer in flight (an unknown one: the oldest).
	for i, f := range s.flights {
		if f.seq == a.seq || a.seq == 0 {
			s.flights = append(s.flights[:i], s.flights[i+1:]...)
			break
		}
	}
	s.releaseFleetProbeLocked() // fleet mode (fleet.go)
}

// Disable takes the deployment out of routing (true) or puts it back at
// now: an operator's drain. Attempts under way finish. In fleet mode the
// fleet drains it too, until one instance enables it.
func (s *State) Disable(now time.Time, disabled bool) {
	s.lock()
	defer s.mu.Unlock()
	// Each action is later than the one before, by a millisecond at least
	// (the store's resolution): a disable and an enable sent in the same
	// millisecond reach the fleet in their order.
	at := now.Truncate(time.Millisecond)
	if !at.After(s.fleet.drainAt) {
		at = s.fleet.drainAt.Add(time.Millisecond)
	}
	s.disabled = disabled
	s.fleet.drainAt = at
	if s.fleet.f != nil {
		s.fleet.f.Publish(Shared{Drain: SharedDrain{At: at, Disabled: disabled}})
	}
}

// Disabled reports whether an operator took the deployment out (Disable).
func (s *State) Disabled() bool {
	s.mu.Lock() // a read: the view stays
	defer s.mu.Unlock()
	return s.disabled
}

// Reset forgets what the deployment's answers taught at now: its circuit
// (open, half-open, consecutive failures) and its stated windows, as if it
// had never answered. Health and declared limits stay. In fleet mode the
// whole fleet forgets it too: every part is published dated now, changed
// here or not (an instance may reset what only the fleet had learned).
func (s *State) Reset(now time.Time) {
	s.lock()
	defer s.mu.Unlock()
	defer s.shareObserved(now, unshared)
	s.openUntil, s.openReason, s.consecutiveFailures, s.probing = time.Time{}, provider.OK, 0, false
	s.capped, s.uncapped = false, false
	s.requests = window{limit: provider.Unknown, remaining: provider.Unknown, stated: provider.Unknown}
	s.tokens = window{limit: provider.Unknown, remaining: provider.Unknown, stated: provider.Unknown}
	s.fleet.reservedUntil, s.fleet.probeElsewhereUntil = time.Time{}, time.Time{}
}

// Snapshot is a copy of a State for display (admin API, logs, tests).
// Counts are provider.Unknown (-1) when the provider never stated them.
type Snapshot struct {
	Circuit             Circuit         `json:"circuit"`
	OpenUntil           time.Time       `json:"open_until,omitzero"`
	OpenReason          provider.Class  `json:"open_reason,omitempty"` // not OK while open
	LimitRequests       int64           `json:"limit_requests"`
	RemainingRequests   int64           `json:"remaining_requests"`
	ResetRequests       time.Time       `json:"reset_requests,omitzero"`
	LimitTokens         int64           `json:"limit_tokens"`
	RemainingTokens     int64           `json:"remaining_tokens"`
	ResetTokens         time.Time       `json:"reset_tokens,omitzero"`
	DeclaredRPM         int64           `json:"declared_rpm,omitempty"`
	DeclaredTPM         int64           `json:"declared_tpm,omitempty"`
	RequestsLastMinute  int64           `json:"requests_last_minute"`
	TokensLastMinute    int64           `json:"tokens_last_minute"`
	LatencyMS           float64         `json:"latency_ewma_ms"`
	TTFTMS              float64         `json:"ttft_ewma_ms"`
	SuccessRate         float64         `json:"success_rate"`
	InFlight            int             `json:"in_flight"`
	ConsecutiveFailures int             `json:"consecutive_failures"`
	Disabled            bool            `json:"disabled,omitempty"`
	LastClass           *provider.Class `json:"last_class,omitempty"` // nil before the first attempt
	LastAt              time.Time       `json:"last_at,omitzero"`
	LastMessage         string          `json:"last_message,omitempty"`
	// Usage is what its answers used and cost, and its failovers.
	Usage UsageReport `json:"usage"`
	// BudgetSpentUntil is when its spent budget renews; absent while it
	// is not spent.
	BudgetSpentUntil time.Time `json:"budget_spent_until,omitzero"`
}

// Snapshot returns a copy of the state as seen at now.
func (s *State) Snapshot(now time.Time) Snapshot {
	f := s.Features(now, 0, false)
	usage := s.Usage(now)
	s.lock()
	defer s.mu.Unlock()
	snap := Snapshot{
		Circuit:             s.circuit(now),
		LimitRequests:       s.requests.limit,
		RemainingRequests:   s.requests.current(now),   // -1 once the window refreshed
		ResetRequests:       s.requests.nextReset(now), // the next one, once a known window was reset
		LimitTokens:         s.tokens.limit,
		RemainingTokens:     s.tokens.current(now),
		ResetTokens:         s.tokens.nextReset(now),
		DeclaredRPM:         s.declared.rpm,
		DeclaredTPM:         s.declared.tpm,
		RequestsLastMinute:  s.declared.requestsIn(now),
		TokensLastMinute:    s.declared.tokensIn(now),
		LatencyMS:           s.latency * 1000,
		TTFTMS:              s.ttft * 1000,
		SuccessRate:         f.Reliability,
		InFlight:            s.inFlight,
		ConsecutiveFailures: s.consecutiveFailures,
		Disabled:            s.disabled,
		LastAt:              s.lastAt,
		LastMessage:         s.lastMessage,
	}
	if s.openUntil.After(now) {
		snap.OpenUntil, snap.OpenReason = s.openUntil, s.openReason
	}
	if !s.lastAt.IsZero() {
		last := s.lastClass
		snap.LastClass = &last
	}
	if s.budgetUntil.After(now) {
		snap.BudgetSpentUntil = s.budgetUntil
	}
	snap.Usage = usage
	return snap
}
