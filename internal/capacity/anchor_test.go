package capacity

import (
	"container/heap"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// fixedWindowProvider is a provider with a fixed window of limit requests
// per span, as PROVIDERS.md describes one: it decides admission and
// computes its headers when a request arrives (travel after the router
// sends it), and a non-streaming answer carries them after the whole
// generation (latency later); a refusal comes back at once. Windows are
// aligned to multiples of span from t0 (a clock-minute window), or start
// with the first request after the last one ended (aligned false).
type fixedWindowProvider struct {
	limit            int64
	span             time.Duration
	aligned          bool
	start            time.Time // the current window's start
	count            int64
	admitted, denied int
}

// admit decides a request arriving at t: its answer's observation, as the
// provider states it at t (remaining after it, the reset as a countdown
// from t).
func (p *fixedWindowProvider) admit(t time.Time) provider.Observation {
	switch {
	case p.aligned:
		if s := t0.Add(t.Sub(t0).Truncate(p.span)); s.After(p.start) || p.start.IsZero() {
			p.start, p.count = s, 0
		}
	case p.start.IsZero() || !t.Before(p.start.Add(p.span)):
		p.start, p.count = t, 0
	}
	reset := p.start.Add(p.span).Sub(t)
	if p.count >= p.limit {
		p.denied++
		o := provider.NewObservation(provider.RateLimited)
		o.Requests = provider.Window{Limit: p.limit, Remaining: 0, Reset: reset}
		o.RetryAfter = reset
		return o
	}
	p.count++
	p.admitted++
	o := provider.NewObservation(provider.OK)
	o.Requests = provider.Window{Limit: p.limit, Remaining: p.limit - p.count, Reset: reset}
	return o
}

// event is an answer reaching the router, or a client looking again.
type event struct {
	at     time.Time
	client int
	answer bool
	a      Attempt
	obs    provider.Observation
}

type events []event

func (e events) Len() int           { return len(e) }
func (e events) Less(i, j int) bool { return e[i].at.Before(e[j].at) }
func (e events) Swap(i, j int)      { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)        { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// rollRun drives a State as the router does (an attempt when AvailableAt
// says now, else a look again then) for clients that always have a
// request, against p, for run; it returns what p admitted and refused.
// admitter is a provider model of rollRun: admit decides a request
// arriving at t and returns what its answer states, and, for a reset
// stated as an instant, that instant (the answer's Reset then counts to it
// from when it is read).
type admitter interface {
	admit(t time.Time) provider.Observation
	counts() (admitted, denied int)
}

func (p *fixedWindowProvider) counts() (int, int) { return p.admitted, p.denied }

// bucketProvider is a token bucket of limit requests refilled
// continuously over span (OpenAI's and Anthropic's, PROVIDERS.md): the
// reset it states is when the bucket is full again, as a countdown, or
// (instant) as an RFC 3339 time in whole seconds, rounded up, that the
// router reads against the answer's Date; or (whole) as a countdown in
// whole seconds, rounded up ("1s", "2s": the simulation's OpenAI dialect
// at one request a second).
type bucketProvider struct {
	limit            int64
	span             time.Duration
	instant, whole   bool
	level            float64
	at               time.Time
	admitted, denied int
}

func (p *bucketProvider) counts() (int, int) { return p.admitted, p.denied }

func (p *bucketProvider) admit(t time.Time) provider.Observation {
	rate := float64(p.limit) / p.span.Seconds()
	if p.at.IsZero() {
		p.level = float64(p.limit)
	} else {
		p.level = min(float64(p.limit), p.level+rate*t.Sub(p.at).Seconds())
	}
	p.at = t
	o := provider.NewObservation(provider.RateLimited)
	if p.level >= 1 {
		p.level--
		p.admitted++
		o = provider.NewObservation(provider.OK)
	} else {
		p.denied++
	}
	full := time.Duration((float64(p.limit) - p.level) / rate * float64(time.Second))
	o.Requests = provider.Window{Limit: p.limit, Remaining: int64(p.level), Reset: full}
	if p.whole {
		o.Requests.Reset, o.Requests.Resolution = (full + time.Second - 1).Truncate(time.Second), time.Second
	}
	if p.instant {
		o.Requests.Instant, o.Requests.Resolution = true, time.Second
		o.Requests.Reset = time.Duration(t.Add(full + time.Second - 1).Truncate(time.Second).UnixNano()) // the instant, read at delivery
	}
	if o.Class == provider.RateLimited {
		o.RetryAfter = full
	}
	return o
}

func rollRun(t *testing.T, p admitter, clients int, latency, travel, run time.Duration, seed uint64) (admitted, denied int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	arrivals := make([]time.Time, clients)
	for c := range arrivals {
		arrivals[c] = t0.Add(time.Duration(rng.Int64N(int64(time.Millisecond))))
	}
	return rollRunFrom(t, p, arrivals, latency, travel, run, rng)
}

// rollRunFrom is rollRun with each client's first arrival given.
func rollRunFrom(t *testing.T, p admitter, arrivals []time.Time, latency, travel, run time.Duration, rng *rand.Rand) (admitted, denied int) {
	t.Helper()
	s := NewState()
	q := &events{}
	for c, at := range arrivals {
		heap.Push(q, event{at: at, client: c})
	}
	end := t0.Add(run)
	for q.Len() > 0 {
		e := heap.Pop(q).(event)
		if e.at.After(end) {
			break
		}
		if e.answer {
			if e.obs.Requests.Instant {
				e.obs.Requests.Reset = provider.ClampWait(time.Unix(0, int64(e.obs.Requests.Reset)).Sub(e.at))
			}
			s.ObserveAttempt(e.a, e.at, e.obs, DefaultPolicy)
			s.ReleaseAttempt(e.a)
			heap.Push(q, event{at: e.at, client: e.client})
			continue
		}
		if at, _ := s.AvailableAt(e.at, 1); at.After(e.at) {
			heap.Push(q, event{at: at, client: e.client})
			continue
		}
		a, ok := s.AcquireAttempt(e.at, 1)
		if !ok {
			heap.Push(q, event{at: e.at.Add(time.Millisecond), client: e.client})
			continue
		}
		arrive := e.at.Add(travel)
		obs := p.admit(arrive)
		back := arrive.Add(travel)
		if obs.Class == provider.OK {
			back = arrive.Add(latency + jitter(rng, latency))
		}
		heap.Push(q, event{at: back, client: e.client, answer: true, a: a, obs: obs})
	}
	return p.counts()
}

// jitter is up to a tenth of d either way.
func jitter(rng *rand.Rand, d time.Duration) time.Duration {
	if d < 10 {
		return 0
	}
	return time.Duration(rng.Int64N(int64(d/5))) - d/10
}

// A fixed window's reset is stated as a countdown when the provider admits
// the request, and read one generation latency later: the router must
// anchor it to the attempt's send, and charge what it sends while it
// cannot tell whether the window rolled to both windows. Taken from when
// the answer is read, each roll drew 429s (0.19-0.30 per served with
// 100 ms answers, more with seconds-long ones).
func TestAWindowRollDrawsNoRateLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		latency time.Duration
		aligned bool
		clients int
	}{
		{"100ms aligned", 100 * time.Millisecond, true, 60},
		{"100ms from the first request", 100 * time.Millisecond, false, 60},
		{"2s aligned", 2 * time.Second, true, 60},
		{"2s from the first request", 2 * time.Second, false, 60},
		{"8s aligned", 8 * time.Second, true, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(5) {
				p := &fixedWindowProvider{limit: 10, span: 10 * time.Second, aligned: tc.aligned}
				run := 5 * time.Minute
				admitted, denied := rollRun(t, p, tc.clients, tc.latency, 5*time.Millisecond, run, seed)
				windows := int(run / p.span)
				if perServed := float64(denied) / float64(max(admitted, 1)); perServed > 0.01 {
					t.Errorf("seed %d: %d provider 429s for %d served (%.3f per served, want <= 0.01)", seed, denied, admitted, perServed)
				}
				// An ideal scheduler serves the limit each window; a roll
				// may cost the uncertainty, not a window. A window that
				// starts with its first request starts when the router
				// knows the last one ended: a latency after it may have.
				if !tc.aligned {
					windows = int(run / (p.span + tc.latency))
				}
				if want := windows * 10 * 9 / 10; admitted < want {
					t.Errorf("seed %d: served %d in %d windows of 10, want >= %d", seed, admitted, windows, want)
				}
			}
		})
	}
}

// A countdown read a latency after the attempt was sent is anchored to the
// send at the earliest and the read at the latest: what is spent from the
// earliest on counts against the next window too, and the window is full
// again only at the latest. An instant needs no anchor.
func TestAResetIsAnchoredBetweenSendAndRead(t *testing.T) {
	s := NewState()
	a, _ := s.AcquireAttempt(t0, 1)
	read := t0.Add(8 * time.Second)
	s.ObserveAttempt(a, read, stated(3, 1, 2*time.Second), DefaultPolicy)
	s.ReleaseAttempt(a)
	w := &s.requests
	if !w.reset.Equal(read.Add(2*time.Second + ResetMargin)) {
		t.Fatalf("full again at %v, want the read plus the countdown plus the margin (+10.05 s)", w.reset.Sub(t0))
	}
	// At +3 s the provider's window may have rolled (it rolled at +2 s
	// if it admitted the attempt at once): what is sent counts twice.
	b, ok := s.AcquireAttempt(read.Add(-5*time.Second), 1)
	if !ok {
		t.Fatal("refused with one left")
	}
	s.ReleaseAttempt(b)
	if w.carry != 1 {
		t.Errorf("carry %d after a spend inside the anchor's interval, want 1", w.carry)
	}
	if got := s.Snapshot(w.reset).RemainingRequests; got != 2 {
		t.Errorf("the next window holds %d, want its limit less what was carried (2)", got)
	}

	s = NewState()
	a, _ = s.AcquireAttempt(t0, 1)
	o := stated(3, 1, 2500*time.Millisecond) // an instant to the millisecond
	o.Requests.Instant = true
	s.ObserveAttempt(a, read, o, DefaultPolicy)
	if w := &s.requests; w.uncertain != ResetMargin {
		t.Errorf("an instant's reset is uncertain by %v, want the margin alone", w.uncertain)
	}
}

// An instant in whole seconds (Anthropic's RFC 3339 reset) read against a
// Date header in whole seconds may be up to two seconds early (its
// Resolution and the Date's): answers of
// one fixed window read at different times overlap, so that they narrow
// the reset instead of each looking like a window of its own (a gap of a
// fraction of a second between two "windows", which projected the next
// roll 0.2 s away and drew a 429 for each attempt sent then).
func TestAWholeSecondInstantIsUncertainByItsResolution(t *testing.T) {
	w := newWindowA()
	inst := func(remaining int64, reset time.Duration) provider.Window {
		o := winA(10, remaining, reset)
		o.Instant, o.Resolution = true, time.Second // as the Anthropic adapter reads "...:10Z"
		return o
	}
	// The window resets at +10 s (stated 00:00:10Z); Date reads +2 s.
	w.update(atA(2100*msA), t0, inst(1, 8*time.Second), 0, 1)
	w.update(atA(2400*msA), t0, inst(0, 8*time.Second), 0, 1)
	if w.gap != 0 {
		t.Errorf("two answers of one window measured a gap of %v between windows", w.gap)
	}
	if lo := w.reset.Add(-w.uncertain); lo.After(atA(10 * time.Second)) {
		t.Errorf("the reset is taken to lie in [+%v, +%v], after the stated instant (+10 s)", lo.Sub(t0), w.reset.Sub(t0))
	}
}

// The windows a forecast counts after the next reset come a window apart,
// however loose the upper bound measured between two stated resets is: a
// reset anchored between a send and a read 2 s later bounds the span only
// to within 2 s, and a forecast with that bound counted one window of four
// too few (the request was told 429 at once, or served late).
func TestAForecastCountsWindowsOfTheLongestStatedSpan(t *testing.T) {
	w := newWindowA()
	w.update(atA(2*time.Second), t0, winA(10, 9, 10*time.Second), 0, 1) // from [+10 s, +12.05 s]
	sent := atA(13 * time.Second)
	w.update(sent.Add(2*time.Second), sent, winA(10, 0, 7*time.Second), 0, 1) // from [+20 s, +22.05 s]
	now := sent.Add(2 * time.Second)
	if got := w.forecast(now, atA(42500*msA), 0, false); got < 30 {
		t.Errorf("forecast %d requests before +42.5 s, want 30: windows of 10 s from +22.05 s (+32.1 s, +42.15 s)", got)
	}
}

// Answers to attempts sent at different times narrow a fixed window's
// reset: it lies in every answer's interval.
func TestAnswersNarrowTheAnchor(t *testing.T) {
	s := NewState()
	a, _ := s.AcquireAttempt(t0, 1)
	b, _ := s.AcquireAttempt(t0.Add(4*time.Second), 1)
	// The window rolls at +10 s; a is admitted at +0 and answered 5 s
	// later, b at +4 s and answered 1.5 s later.
	s.ObserveAttempt(a, t0.Add(5*time.Second), stated(10, 8, 10*time.Second), DefaultPolicy)
	s.ObserveAttempt(b, t0.Add(5500*time.Millisecond), stated(10, 7, 6*time.Second), DefaultPolicy)
	w := &s.requests
	lo, hi := w.reset.Add(-w.uncertain), w.reset
	if want := t0.Add(10 * time.Second); lo.After(want) || hi.Before(want) {
		t.Fatalf("the anchor [%v, %v] misses the reset at +10 s", lo.Sub(t0), hi.Sub(t0))
	}
	if hi.Sub(lo) > 1600*time.Millisecond {
		t.Errorf("the anchor [%v, %v] was not narrowed by the second answer", lo.Sub(t0), hi.Sub(t0))
	}
}

// The gap between two stated resets bounds a window's span only while the
// limits stay: a countdown longer than it (the operator's account got a
// longer window, or another config's state) drops it, so that the window
// is not projected to roll early.
func TestAStaleGapIsDropped(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(10, 5, time.Second), 0, 0)
	w.update(atA(1100*msA), atA(1100*msA), winA(10, 5, time.Second), 0, 0) // the next 1 s window
	if p := w.period(); p <= 0 || p > 1200*msA {
		t.Fatalf("expected a period of about 1.1 s from two stated resets, got %v", p)
	}
	now := atA(3 * time.Second)
	w.update(now, now, winA(10, 9, 2*time.Second), 0, 0) // now 2 s windows
	if p := w.period(); p < 2*time.Second {
		t.Errorf("a 2 s countdown left the period at %v", p)
	}
}

// A window that counts what answers used, not the estimate (max_tokens
// of 4,000 on a window of 1,500 tokens, 30 counted), says so with its
// first answer: the forecast does not take the estimate as what it
// counts, and a burst is not told 429 for a window it fits in.
func TestAFirstAnswerBoundsTheRatio(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(1500, 1470, 2*time.Second), 0, 4030)
	if got := w.forecastUnits(t0, t0, 0, false); got < 10*4030 {
		t.Errorf("1,470 left at most 30 counted per 4,030 estimated: expected room for at least 10 such requests (40,300 units), got %d", got)
	}
	// A window that admits on the estimate bounds nothing.
	w = newWindowA()
	w.update(t0, t0, winA(4000, 3099, 2*time.Second), 0, 901)
	if got := w.forecastUnits(t0, t0, 0, false); got != 3099 {
		t.Errorf("901 counted of 901: expected the window's own 3,099, got %d", got)
	}
}

// A window that starts with its first request (PROVIDERS.md: not every
// provider aligns its windows to the clock) starts its next span when the
// router's first attempt after the stated reset arrives: the router must
// not project the roll a span after the stated reset (a window starting
// 1 s after that reset rolls 1 s after such a projection), nor forecast
// the requests of a window that does not start before the deadline.
func TestAWindowFromItsFirstRequestRollsASpanAfterIt(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(10, 9, 10*time.Second), 0, 1) // the first of its window: the whole span
	now := atA(11 * time.Second)                        // a second after the window ended
	until := now.Add(19900 * msA)
	if got := w.forecast(now, until, 0, false); got > 20 {
		t.Errorf("forecast %d requests before +30.9 s, want at most 20: a window from the first request at +11 s rolls at +21 s and +31 s", got)
	}
	w.spend(now, 1)
	if want := now.Add(10 * time.Second); w.nextReset(now).Before(want) {
		t.Errorf("full again at +%v, before the provider's window from +11 s ends (+21 s)", w.nextReset(now).Sub(t0))
	}
}

// A countdown in whole seconds ("8", "8s") that a provider rounds down
// puts the true reset up to a second later than stated: once a 429 showed
// that the provider rounds, the window is not taken to be full again
// before that (a provider stating "8" for 8.87 s drew a 429 for every
// attempt the router sent in the gap, each window).
func TestAWholeSecondCountdownIsFullAgainASecondLater(t *testing.T) {
	w := newWindowA()
	o := winA(10, 0, 8*time.Second)
	o.Resolution = time.Second
	read := atA(100 * msA)
	w.update(read, t0, o, 0, 1)
	if want := read.Add(8*time.Second + ResetMargin); !w.reset.Equal(want) {
		t.Fatalf("before any 429, \"8s\" is exact: full again at +%v, want +%v", w.reset.Sub(t0), want.Sub(t0))
	}
	w.learnRounded(time.Second) // a 429 stated the window in whole seconds (State.observe)
	if want := read.Add(9*time.Second + ResetMargin); w.reset.Before(want) {
		t.Errorf("full again at +%v, before the latest a floored countdown allows (+%v)", w.reset.Sub(t0), want.Sub(t0))
	}
	if lo := w.reset.Add(-w.uncertain); lo.After(t0.Add(7 * time.Second)) {
		t.Errorf("the carry starts at +%v, after the earliest a rounded-up countdown allows (+7 s)", lo.Sub(t0))
	}
	// A provider that states finer countdowns states a whole one exactly.
	w = newWindowA()
	w.update(atA(50*msA), t0, winA(10, 5, 9950*msA), 0, 1)
	w.learnRounded(time.Second)
	w.update(read, t0, o, 0, 1)
	if want := read.Add(8*time.Second + ResetMargin); !w.reset.Equal(want) {
		t.Errorf("after a countdown to the nanosecond, \"8s\" is full again at +%v, want +%v", w.reset.Sub(t0), want.Sub(t0))
	}
}

// Only a 429 where the router believed the window had room teaches that
// the provider rounds its whole countdowns; a first 429 (nothing known)
// teaches nothing.
func TestAnUnpredicted429TeachesRounding(t *testing.T) {
	whole := func(c provider.Class, remaining int64) provider.Observation {
		o := provider.NewObservation(c)
		o.Requests = provider.Window{Limit: 10, Remaining: remaining, Reset: 8 * time.Second, Resolution: time.Second}
		return o
	}
	s := NewState()
	a, _ := s.AcquireAttempt(t0, 1)
	s.ObserveAttempt(a, t0, whole(provider.RateLimited, 0), DefaultPolicy)
	s.ReleaseAttempt(a)
	if s.requests.rounded {
		t.Error("a first 429, with nothing known of the window, taught rounding")
	}
	s = NewState()
	s.Observe(t0, whole(provider.OK, 5), DefaultPolicy)
	a, _ = s.AcquireAttempt(t0, 1)
	s.ObserveAttempt(a, t0, whole(provider.RateLimited, 0), DefaultPolicy)
	if !s.requests.rounded {
		t.Error("a 429 where 5 were believed left taught no rounding")
	}
}

// A window whose type says it bounds a request by its estimate (OpenAI's
// x-ratelimit-limit-tokens) but that answered an attempt estimated above
// its limit does not count the estimate (an OpenAI-compatible server that
// counts what answers used): larger requests are not refused there, until
// a too_large answer says they are.
func TestAnAnsweredLargeAttemptUncapsTheWindow(t *testing.T) {
	bounded := func(c provider.Class, limit, remaining int64) provider.Observation {
		o := provider.NewObservation(c)
		o.Tokens = provider.Window{Limit: limit, Remaining: remaining, Reset: 2 * time.Second, BoundsRequest: true}
		return o
	}
	s := NewState()
	s.Observe(t0, bounded(provider.OK, 1500, 1500), DefaultPolicy)
	if ok, _ := s.FitsTokens(4030); ok {
		t.Fatal("a window that bounds a request: expected 4,030 tokens not to fit 1,500")
	}
	a, _ := s.AcquireAttempt(t0, 4030)
	s.ObserveAttempt(a, t0, bounded(provider.OK, 1500, 1470), DefaultPolicy)
	s.ReleaseAttempt(a)
	if ok, _ := s.FitsTokens(4030); !ok {
		t.Error("an attempt of 4,030 was answered on 1,500: expected the next to fit")
	}
	s.Observe(t0, bounded(provider.TooLarge, 1500, 1470), DefaultPolicy)
	if ok, _ := s.FitsTokens(4030); ok {
		t.Error("after too_large: expected 4,030 tokens not to fit 1,500")
	}
}

// A statement is narrowed by what the provider stated, never by the
// router's own projection of the next reset: a projection made at a roll
// may be early (a provider that rounds its countdowns down), and taking
// the earlier of it and a later statement rolled the window early again,
// a 429 for every attempt sent then.
func TestAProjectionDoesNotNarrowAStatement(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(10, 0, 10*time.Second), 0, 1)
	roll := atA(10*time.Second + ResetMargin)
	w.spend(roll, 1) // a roll: the next reset projected a span later
	projected := w.reset
	read := roll.Add(150 * msA)
	w.update(read, roll, winA(10, 9, 9950*msA), 0, 1) // the provider: 9.95 s more, read 150 ms later
	if want := read.Add(9950*msA + ResetMargin); w.reset.Before(want) {
		t.Errorf("full again at +%v (the projection was +%v), before the statement allows (+%v)", w.reset.Sub(t0), projected.Sub(t0), want.Sub(t0))
	}
}

// The longest countdown stated is the longest, not the last one: before
// any gap between stated resets is known, a later, shorter countdown of
// the same window does not shorten what a forecast counts windows with.
func TestTheLongestCountdownIsKept(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(10, 9, 10*time.Second), 0, 1)
	w.update(atA(2*time.Second), atA(2*time.Second), winA(10, 8, 8*time.Second), 0, 1)
	if w.longest != 10*time.Second {
		t.Errorf("longest countdown %v after 10 s then 8 s, want 10 s", w.longest)
	}
}

// A token bucket under a burst states a reset that moves a refill later
// with each admission (remaining 9, reset 1s; 8, 2s; ...), and, read after
// it passed, an instant that says nothing of the span: the router must tell
// it from a fixed window and pace it, and never send more than its limit
// at once. Taken for a fixed window, every roll drew 429s (the window
// refilled at the stated reset by what the router spent since, not by
// its limit); with its span unknown, the router sent every client at
// once.
func TestABucketUnderABurstDrawsNoRateLimit(t *testing.T) {
	for _, tc := range []struct {
		name           string
		latency        time.Duration
		instant, whole bool
	}{
		{"100ms countdown", 100 * time.Millisecond, false, false},
		{"2s countdown", 2 * time.Second, false, false},
		{"100ms whole-second countdown", 100 * time.Millisecond, false, true},
		{"2s whole-second countdown", 2 * time.Second, false, true},
		{"100ms instant", 100 * time.Millisecond, true, false},
		{"2s instant", 2 * time.Second, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(5) {
				p := &bucketProvider{limit: 10, span: 10 * time.Second, instant: tc.instant, whole: tc.whole}
				run := 5 * time.Minute
				admitted, denied := rollRun(t, p, 60, tc.latency, 5*time.Millisecond, run, seed)
				if perServed := float64(denied) / float64(max(admitted, 1)); perServed > 0.01 {
					t.Errorf("seed %d: %d provider 429s for %d served (%.3f per served, want <= 0.01)", seed, denied, admitted, perServed)
				}
				if want := int(run/time.Second) * 9 / 10; admitted < want {
					t.Errorf("seed %d: served %d at 1 a second for %v, want >= %d", seed, admitted, run, want)
				}
			}
		})
	}
}

// A provider that floors its countdowns to whole seconds (8.87 s stated
// "8") states resets of one fixed window too close together to be exact:
// "10" at its start, "8" at 1.3 s of the next window ending at 20 s
// (taken as exact: a reset at 9.3 s past the first, closer than the
// 10 s countdown, which no window is shorter than). The router learns
// the rounding then, before a 429 would teach it, and takes the window to
// be full again no earlier than it is.
func TestResetsTooCloseTeachRounding(t *testing.T) {
	floored := func(remaining int64, c time.Duration) provider.Observation {
		o := provider.NewObservation(provider.OK)
		o.Requests = provider.Window{Limit: 10, Remaining: remaining, Reset: c.Truncate(time.Second), Resolution: time.Second}
		return o
	}
	p := &fixedWindowProvider{limit: 10, span: 10 * time.Second, aligned: true}
	s := NewState()
	first := p.admit(t0)
	first.Requests.Reset, first.Requests.Resolution = first.Requests.Reset.Truncate(time.Second), time.Second
	s.Observe(t0, first, DefaultPolicy)
	at := t0.Add(11*time.Second + 300*time.Millisecond)
	a, _ := s.AcquireAttempt(at, 1)
	read := at.Add(100 * time.Millisecond)
	s.ObserveAttempt(a, read, floored(8, t0.Add(20*time.Second).Sub(at)), DefaultPolicy)
	s.ReleaseAttempt(a)
	if !s.requests.rounded {
		t.Fatal("two floored countdowns closer than a window taught no rounding")
	}
	for range 8 {
		s.AcquireAttempt(read, 1)
	}
	if at, _ := s.AvailableAt(read, 1); at.Before(t0.Add(20 * time.Second)) {
		t.Errorf("the window is full again at +20 s, the router takes it at %v", at.Sub(t0))
	}
}

// flooringProvider is a fixed window that states its countdowns in whole
// seconds rounded down, plain ("8" for 8.87 s), as some OpenAI-compatible
// servers do (PROVIDERS.md; the simulation's rounded-resets): the true
// reset is up to a second later than stated.
type flooringProvider struct{ fixedWindowProvider }

func (p *flooringProvider) admit(t time.Time) provider.Observation {
	o := p.fixedWindowProvider.admit(t)
	o.Requests.Reset, o.Requests.Resolution = o.Requests.Reset.Truncate(time.Second), time.Second
	if o.Class == provider.RateLimited {
		o.RetryAfter = o.Requests.Reset
	}
	return o
}

// A burst whose arrivals are a microsecond apart, at the start of a
// window, on a provider that floors its countdowns to whole seconds: the
// first request states "10" (10 s exactly), the next, a microsecond
// later, "9" (9.999999 s). The two are too close to be exact, whatever
// order their answers come in: the router takes the countdowns as rounded
// from then on, and the window as full again no earlier than it is. The
// "10", answered after a "9", was skipped as stale with its evidence, and
// the rounding learned from another statement was undone by narrowing it
// with the statement read as exact: the roll at the "9" drew a 429 for
// each attempt sent in the second it hid.
func TestAFlooredCountdownIsRoundedFromTheFirstStatement(t *testing.T) {
	for _, tc := range []struct {
		name    string
		aligned bool
		latency time.Duration
	}{
		{"aligned, 100ms", true, 100 * time.Millisecond},
		{"from the first request, 100ms", false, 100 * time.Millisecond},
		{"aligned, 2s", true, 2 * time.Second},
		{"from the first request, 2s", false, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(5) {
				p := &flooringProvider{fixedWindowProvider{limit: 10, span: 10 * time.Second, aligned: tc.aligned}}
				arrivals := make([]time.Time, 60)
				for c := range arrivals { // at a window's start, aligned or not; the seed draws the latencies
					arrivals[c] = t0.Add(time.Duration(c) * time.Microsecond)
				}
				run := 2 * time.Minute
				admitted, denied := rollRunFrom(t, p, arrivals, tc.latency, 0, run, rand.New(rand.NewPCG(seed, 1)))
				if perServed := float64(denied) / float64(max(admitted, 1)); perServed > 0.01 {
					t.Errorf("seed %d: %d provider 429s for %d served (%.3f per served, want <= 0.01)", seed, denied, admitted, perServed)
				}
				// A roll may cost the countdown's unit and the latency, not a window.
				windows := int(run / (p.span + time.Second + tc.latency))
				if want := windows * 10 * 9 / 10; admitted < want {
					t.Errorf("seed %d: served %d, want >= %d (%d windows of 10)", seed, admitted, want, windows)
				}
			}
		})
	}
}

// The gap between two windows' resets bounds the span with whole
// countdowns read as stated while no rounding was seen: a unit at each end
// would stretch the bound past the next window. "10s" stated at +0 s
// (read at +2 s) and "10s" at +13 s (read at +15 s) bound a window at 15
// s, not 17 (a unit at each end): a forecast from the roll at +26 s to
// +42 s counts the next window, as the simulation's ideal does (with the
// units counted from the first statement, window-roll seed 17 served 20
// of 30, and seed 19, a bucket stating "1s", "2s", ..., 20 of 39).
func TestAGapIsNotStretchedByRounding(t *testing.T) {
	whole := func(remaining int64) provider.Window {
		o := winA(10, remaining, 10*time.Second)
		o.Resolution = time.Second
		return o
	}
	w := newWindowA()
	w.update(atA(2*time.Second), t0, whole(9), 0, 1)
	send := atA(13 * time.Second)
	for range 10 {
		w.spend(send, 1)
	}
	w.update(atA(15*time.Second), send, whole(0), 9, 1)
	roll := atA(26 * time.Second)
	if got := w.forecast(roll, atA(42*time.Second), 0, false); got < 19 {
		t.Errorf("forecast %d from +26 s to +42 s (gap %v, next reset +%v), want >= 19: the window left and the next one", got, w.gap, w.nextReset(roll).Sub(t0))
	}
}

// A bucket warmed by one request states "9 left, full in 1s" (30 per
// 10 s: "29 left, 333ms"), which a fixed window of that span states as
// well; its burst's answers come a generation later (2 s, 20 s), so that
// when the router's projection of that span passes it has seen no
// statement of the window it would spend: it must not take it to be full
// again, but refilled at no more than the rate its statements imply, until
// an answer shows which it is. Taken for a fixed window of 1 s, each
// projected roll sent the whole limit again: 9 of 10 refused (the window
// roll scenario's 20 s answers, seeds 1, 14 and 15).
func TestABucketWarmedByOneRequestIsNotRefilledAtAProjection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limit   int64
		latency time.Duration
	}{
		{"10 per 10s, 20s answers", 10, 20 * time.Second},
		{"30 per 10s, 20s answers", 30, 20 * time.Second},
		{"30 per 10s, 2s answers", 30, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(5) {
				p := &bucketProvider{limit: tc.limit, span: 10 * time.Second}
				arrivals := []time.Time{t0} // the warm-up, then a burst after the bucket is full
				for range 120 {             // more than the bucket serves in a generation
					arrivals = append(arrivals, t0.Add(32*time.Second))
				}
				run := 2 * time.Minute
				admitted, denied := rollRunFrom(t, p, arrivals, tc.latency, 5*time.Millisecond, run, rand.New(rand.NewPCG(seed, 1)))
				if perServed := float64(denied) / float64(max(admitted, 1)); perServed > 0.01 {
					t.Errorf("seed %d: %d provider 429s for %d served (%.3f per served, want <= 0.01)", seed, denied, admitted, perServed)
				}
				// Full at the burst, then the rate: limit per 10 s (less
				// a ResetMargin a step while the pace lasts: 13% at 3 a
				// second).
				rate := float64(tc.limit) / 10
				if want := int((float64(tc.limit) + rate*(run-32*time.Second).Seconds()) * 0.8); admitted < want {
					t.Errorf("seed %d: served %d, want >= %d (the limit, then %.0f a second)", seed, admitted, want, rate)
				}
			}
		})
	}
}

// A window whose reset passed before any span was known (an instant read
// after it passed: Anthropic's with 20 s answers) holds its limit for one
// burst; what it spends then is in the provider's current window, not
// charged to the next one as well: once an answer states that window
// over too, nothing sent since, it is full again. Charged as a carry
// (spent "within the uncertainty before" a reset that was zero), the next
// window held 1 of 10, and the window-roll scenario's Anthropic 20 s
// seeds served 11 of 40.
func TestAHoldingWindowsBurstIsNotChargedToTheNext(t *testing.T) {
	passed := func(remaining int64) provider.Observation {
		o := provider.NewObservation(provider.OK)
		o.Requests = provider.Window{Limit: 10, Remaining: remaining, Reset: 0, Instant: true, Resolution: time.Second}
		return o
	}
	s := NewState()
	warm, _ := s.AcquireAttempt(t0, 1)
	s.ObserveAttempt(warm, t0.Add(21*time.Second), passed(9), DefaultPolicy)
	s.ReleaseAttempt(warm)
	burst := t0.Add(32 * time.Second)
	var sent []Attempt
	for range 11 {
		if a, ok := s.AcquireAttempt(burst, 1); ok {
			sent = append(sent, a)
		}
	}
	if len(sent) != 10 {
		t.Fatalf("the holding window let %d go at once, want its limit, 10", len(sent))
	}
	read := t0.Add(51 * time.Second)
	s.ObserveAttempt(sent[2], read, passed(7), DefaultPolicy) // the burst's window is over too
	s.ReleaseAttempt(sent[2])
	after := read.Add(100 * time.Millisecond)
	n := 0
	for range 11 {
		if _, ok := s.AcquireAttempt(after, 1); ok {
			n++
		}
	}
	if n != 10 {
		t.Errorf("after the burst's window was stated over, %d went, want 10 (nothing was sent in the window since)", n)
	}
}

// The pace is this instance's reading of its own projection: a window
// the fleet states (another instance's count and reset, Merge) is the
// fleet's, full again at that reset. Paced still, it refilled by one an
// interval where the fleet's window held its limit (fleet-burst@2s drew
// answers past the deadline).
func TestAWindowTheFleetStatesIsNotPaced(t *testing.T) {
	s := NewState()
	warm, _ := s.AcquireAttempt(t0, 1)
	o := provider.NewObservation(provider.OK)
	o.Requests = provider.Window{Limit: 10, Remaining: 9, Reset: time.Second}
	s.ObserveAttempt(warm, t0.Add(100*time.Millisecond), o, DefaultPolicy) // a bucket's as well as a 1 s window's
	s.ReleaseAttempt(warm)
	burst := t0.Add(10 * time.Second)
	for range 10 {
		s.AcquireAttempt(burst, 1) // a projected roll: paced from here
	}
	at := burst.Add(100 * time.Millisecond)
	s.Merge(Shared{Requests: SharedWindow{At: at, Limit: 10, Remaining: 0, Reset: at.Add(5 * time.Second)}})
	after := at.Add(5*time.Second + ResetMargin)
	n := 0
	for range 11 {
		if _, ok := s.AcquireAttempt(after, 1); ok {
			n++
		}
	}
	if n != 10 {
		t.Errorf("after the fleet's stated reset, %d went, want the limit, 10", n)
	}
}

// An instant that had passed when its answer was given (Anthropic's
// whole-second instants after a generation longer than the wait:
// provider.Window.Passed) says when the window was full again, between
// the attempt's send and its read: not at the read. Taken as "full now"
// (Reset 0, anchored to the read), the window held the answer's stale
// count for a margin after it, and what the queue sent at the read was
// charged to the next window too: 9 of a full window's 10 went, and the
// next one held 1.
func TestAPassedInstantIsAnchoredWhereItWasStated(t *testing.T) {
	s := NewState()
	warm, _ := s.AcquireAttempt(t0, 1)
	o := provider.NewObservation(provider.OK)
	o.Requests = provider.Window{Limit: 10, Remaining: 9, Reset: 0, Instant: true, Resolution: time.Second,
		Passed: 11 * time.Second} // full again at 10 s, read at 21 s
	read := t0.Add(21 * time.Second)
	s.ObserveAttempt(warm, read, o, DefaultPolicy)
	s.ReleaseAttempt(warm)
	n := 0
	for range 11 {
		if _, ok := s.AcquireAttempt(read.Add(time.Millisecond), 1); ok {
			n++
		}
	}
	if n != 10 {
		t.Errorf("at the read of a window full again 11 s before, %d went, want its limit, 10", n)
	}
}

// A statement that proves what a window is (a bucket, here; a fixed
// window likewise) changes what it can serve before a deadline, so the
// observation says Learned, and the router's queue looks again at once:
// the requests the window cannot serve are told then, not when the next
// attempt ends. A bucket of 10 per 10 s warmed by one request ("9 left,
// 1s" is also a window of 10 per second) under a burst of 10: "1 left,
// 9s" (95 ms), then "8 left, 2s", stale, which proves the bucket (97.9
// ms). Learned stayed false (only a first limit set it), and the
// simulation's window-roll seed 19 told its 21 unservable requests at
// 136.7 ms, when the next attempt's stream ended.
func TestAStatementThatProvesABucketIsLearned(t *testing.T) {
	stating := func(remaining int64, reset time.Duration) provider.Observation {
		o := provider.NewObservation(provider.OK)
		o.Requests = provider.Window{Limit: 10, Remaining: remaining, Reset: reset, Resolution: time.Second}
		return o
	}
	s := NewState()
	warm, _ := s.AcquireAttempt(t0, 1)
	if !s.ObserveAttempt(warm, t0.Add(127*time.Millisecond), stating(9, time.Second), DefaultPolicy).Learned {
		t.Fatal("a window's first limit is not Learned")
	}
	s.ReleaseAttempt(warm)
	burst := t0.Add(11127 * time.Millisecond)
	var as []Attempt
	for range 10 {
		a, _ := s.AcquireAttempt(burst, 1)
		as = append(as, a)
	}
	deadline := burst.Add(30 * time.Second)
	s.ObserveAttempt(as[8], burst.Add(95*time.Millisecond), stating(1, 9*time.Second), DefaultPolicy)
	read := burst.Add(97870 * time.Microsecond)
	before, _ := s.Forecast(read, deadline, 0)
	got := s.ObserveAttempt(as[1], read, stating(8, 2*time.Second), DefaultPolicy)
	after, _ := s.Forecast(read, deadline, 0)
	if after >= before || after > 29 {
		t.Fatalf("forecast to the deadline %d before the statement, %d after: want the bucket's 29", before, after)
	}
	if !got.Learned {
		t.Errorf("the statement that proved a bucket (forecast %d -> %d) is not Learned: the queue does not look again", before, after)
	}
}

// A window whose statements were a bucket's as well as a fixed window's
// is paced at the bucket's rate from a projected roll; once statements
// prove it fixed, the phase of its windows is still unknown until an
// answer to an attempt sent at the pace comes (with 20 s answers on 10 s
// windows, 20 s after it went). Meanwhile it holds what a fixed window
// of its span holds whatever its phase: its limit less what was sent in
// the last span (each window of the span lies in such an interval), not
// the bucket's rate. "9 left, 10s" read 21.9 s after the warm-up (a
// window of 10 per 10 s, or a bucket of 10 per 100 s), a burst of 10 at
// 32.9 s, one paced at 42.9 s, then two of the burst's answers proving a
// fixed window (9 and 7 left, both "10s") at 52.1 s: paced still, one
// more went at 53 s and none at 52.2 s, and the simulation's window-roll
// seeds 25, 26, 46, 47 and 49 served 12 where 21 went safely.
func TestAProvedFixedWindowOfUnknownPhaseHoldsWhatASpanAllows(t *testing.T) {
	stating := func(remaining int64) provider.Observation {
		o := provider.NewObservation(provider.OK)
		o.Requests = provider.Window{Limit: 10, Remaining: remaining, Reset: 10 * time.Second, Resolution: time.Second}
		return o
	}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	s := NewState()
	take := func(ms int) (as []Attempt) {
		for range 11 {
			if a, ok := s.AcquireAttempt(at(ms), 1); ok {
				as = append(as, a)
			}
		}
		return as
	}
	warm, _ := s.AcquireAttempt(t0, 1)
	s.ObserveAttempt(warm, at(21863), stating(9), DefaultPolicy)
	s.ReleaseAttempt(warm)
	burst := take(32863)
	if len(burst) != 10 {
		t.Fatalf("the burst on a full window: %d went, want 10", len(burst))
	}
	if n := len(take(42913)); n != 1 {
		t.Fatalf("at the projected roll, paced: %d went, want the bucket's 1", n)
	}
	s.ObserveAttempt(burst[0], at(51277), stating(9), DefaultPolicy)
	s.ObserveAttempt(burst[2], at(52107), stating(7), DefaultPolicy) // 0.1 and 0.3 a second: no bucket
	for _, want := range []struct {
		ms, n int
		why   string
	}{
		{52200, 9, "the limit less the one sent in the last span"},
		{52900, 0, "the span since 42.9 s holds 10"},
		{53000, 1, "42.9 s's left the span"},
		{62000, 0, "the span since 52.2 s holds 10"},
		{62300, 9, "52.2 s's left the span"},
	} {
		if n := len(take(want.ms)); n != want.n {
			t.Errorf("at %.1f s: %d went, want %d (%s)", float64(want.ms)/1000, n, want.n, want.why)
		}
	}
}

// A passed instant earlier than the attempt's send is the provider's
// clock's skew (or a fake's: its Date on another clock than its reset),
// not a window that was full again before the request reached it: it is
// anchored at the send at the earliest, the safe side. Anchored 20 h
// back, the warm-up's own "0 left" was read as a window full again, and
// a request went at once into the window it had just spent (the root
// module's TestWaitingCountsAreNoDemandOnMessagesWindows).
func TestAnInstantBeforeTheSendIsAnchoredAtTheSend(t *testing.T) {
	s := NewState()
	warm, _ := s.AcquireAttempt(t0, 1)
	o := provider.NewObservation(provider.OK)
	o.Requests = provider.Window{Limit: 1, Remaining: 0, Reset: 0, Instant: true, Resolution: time.Second,
		Passed: 20 * time.Hour}
	s.ObserveAttempt(warm, t0, o, DefaultPolicy)
	s.ReleaseAttempt(warm)
	if _, ok := s.AcquireAttempt(t0.Add(time.Millisecond), 1); ok {
		t.Errorf("a window stated spent, full again 20 h before its attempt was sent: an attempt went at once")
	}
}
