package capacity

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// bStatedTokens is a success stating a tokens window.
func bStatedTokens(limit, remaining int64, reset time.Duration) provider.Observation {
	o := provider.NewObservation(provider.OK)
	o.Tokens = provider.Window{Limit: limit, Remaining: remaining, Reset: reset}
	return o
}

// bAcquireN takes up to n attempts of tokens tokens at now and returns how
// many were let through.
func bAcquireN(s *State, now time.Time, n int, tokens int64) int {
	got := 0
	for range n {
		if s.Acquire(now, tokens) {
			got++
		}
	}
	return got
}

// The declared rpm forecasts what is left of it now: 10 per minute, 3
// already sent, 7 more may start before anything expires.
func TestDeclaredForecastCountsWhatIsLeft(t *testing.T) {
	s := NewState()
	s.Declare(10, 0)
	if got := bAcquireN(s, t0, 3, 1); got != 3 {
		t.Fatalf("expected 3 attempts let through, got %d", got)
	}
	now := t0.Add(time.Second)
	if r, tk := s.Forecast(now, now, 0); r != 7 || tk != provider.Unknown {
		t.Errorf("expected 7 requests left and tokens unbounded, got %d %d", r, tk)
	}
	if r, _ := s.Forecast(now, now.Add(30*time.Second), 0); r != 7 {
		t.Errorf("nothing expires within 30 s: expected 7, got %d", r)
	}
}

// A server error that states nothing teaches nothing about capacity: it
// does not end slow start and reports nothing learned.
func TestAServerErrorIsNoAnswer(t *testing.T) {
	s := NewState()
	res := s.Observe(t0, provider.NewObservation(provider.Server), Policy{})
	if res.Learned {
		t.Error("a server error stating no window: expected nothing learned")
	}
	if got := bAcquireN(s, t0, SlowStart+1, 1); got != SlowStart {
		t.Errorf("expected slow start to hold (%d in flight), got %d", SlowStart, got)
	}
}

// With no backoff configured, a failure has no cooldown: it opens no
// circuit, so the deployment keeps taking concurrent attempts (no
// single half-open probe).
func TestAFailureWithoutCooldownOpensNoCircuit(t *testing.T) {
	s := NewState()
	s.Declare(1000, 0) // bounded: no slow start
	res := s.Observe(t0, provider.NewObservation(provider.Server), Policy{})
	if res.Cooldown != 0 || res.Opened {
		t.Errorf("expected no cooldown and no circuit opened, got %+v", res)
	}
	if c := s.Snapshot(t0).Circuit; c != Closed {
		t.Errorf("expected the circuit closed, got %s", c)
	}
	if got := bAcquireN(s, t0, 3, 1); got != 3 {
		t.Errorf("expected 3 concurrent attempts, got %d", got)
	}
}

// A failure that states a window is an answer from the provider, even
// when the limit it states is 0: slow start ends with it.
func TestAFailureStatingAWindowEndsSlowStart(t *testing.T) {
	for _, tokens := range []bool{false, true} {
		s := NewState()
		rl := provider.NewObservation(provider.RateLimited)
		w := provider.Window{Limit: 0, Remaining: 0, Reset: 10 * time.Second}
		if tokens {
			rl.Tokens = w
		} else {
			rl.Requests = w
		}
		if res := s.Observe(t0, rl, DefaultPolicy); !res.Learned {
			t.Errorf("tokens %v: expected the answer to end slow start (learned)", tokens)
		}
		// After the reset, nothing bounds the deployment: no slow start.
		now := t0.Add(11 * time.Second)
		if got := bAcquireN(s, now, SlowStart+1, 1); got != SlowStart+1 {
			t.Errorf("tokens %v: expected %d attempts after slow start ended, got %d", tokens, SlowStart+1, got)
		}
	}
}

// A probe that proves a deployment back erases the failures that opened
// its circuit from its reliability.
func TestAProbeRestoresReliability(t *testing.T) {
	s := NewState()
	for range 3 {
		s.Observe(t0, provider.NewObservation(provider.Server), DefaultPolicy)
	}
	now := t0.Add(healthHalfLife) // half-open long since; the failures weigh half
	if c := s.Snapshot(now).Circuit; c != HalfOpen {
		t.Fatalf("expected half-open, got %s", c)
	}
	a, ok := s.AcquireAttempt(now, 1)
	if !ok || !a.Probe {
		t.Fatalf("expected the probe, got %+v %v", a, ok)
	}
	s.ObserveAttempt(a, now, provider.NewObservation(provider.OK), DefaultPolicy)
	s.ReleaseAttempt(a)
	if r := s.Features(now, 1, false).Reliability; !near(r, 1) {
		t.Errorf("expected the probe's success to restore reliability to 1, got %v", r)
	}
}

// A burst's failures (attempts in flight together, one outage: one
// consecutive failure) are all forgiven by the probe's success, not one
// of them: reliability is back where it was before the burst.
func TestAProbeForgivesAWholeBurst(t *testing.T) {
	s := NewState()
	for range 4 {
		s.Observe(t0, provider.NewObservation(provider.OK), DefaultPolicy)
	}
	var burst []Attempt
	for range 8 {
		a, ok := s.AcquireAttempt(t0, 1)
		if !ok {
			t.Fatal("expected the burst's attempts to go out")
		}
		burst = append(burst, a)
	}
	for _, a := range burst {
		s.ObserveAttempt(a, t0, provider.NewObservation(provider.Server), DefaultPolicy)
		s.ReleaseAttempt(a)
	}
	if n := s.Snapshot(t0).ConsecutiveFailures; n != 1 {
		t.Fatalf("expected the burst to count as one consecutive failure, got %d", n)
	}
	now := t0.Add(2 * time.Second)
	a, ok := s.AcquireAttempt(now, 1)
	if !ok || !a.Probe {
		t.Fatalf("expected the probe, got %+v %v", a, ok)
	}
	s.ObserveAttempt(a, now, provider.NewObservation(provider.OK), DefaultPolicy)
	s.ReleaseAttempt(a)
	if r := s.Features(now, 1, false).Reliability; r < 0.999 {
		t.Errorf("expected the probe's success to restore reliability to 1, got %v", r)
	}
}

// Attempts of the burst still in flight when the probe proved the
// deployment back, that fail after it (sent before the outage's first
// failure, answered late), are the outage the probe closed: they neither
// reopen the circuit nor hold the reliability down again. A failure of an
// attempt sent after the probe is a new one.
func TestLateFailuresOfAClosedOutage(t *testing.T) {
	s := NewState()
	for range 4 {
		s.Observe(t0, provider.NewObservation(provider.OK), DefaultPolicy)
	}
	var burst []Attempt
	for range 8 {
		a, _ := s.AcquireAttempt(t0, 1)
		burst = append(burst, a)
	}
	fail := func(a Attempt, at time.Time) {
		s.ObserveAttempt(a, at, provider.NewObservation(provider.Server), DefaultPolicy)
		s.ReleaseAttempt(a)
	}
	for _, a := range burst[:4] {
		fail(a, t0.Add(300*time.Millisecond))
	}
	now := t0.Add(1900 * time.Millisecond)
	p, ok := s.AcquireAttempt(now, 1)
	if !ok || !p.Probe {
		t.Fatalf("expected the probe, got %+v %v", p, ok)
	}
	s.ObserveAttempt(p, now, provider.NewObservation(provider.OK), DefaultPolicy)
	s.ReleaseAttempt(p)
	now = now.Add(100 * time.Millisecond)
	for _, a := range burst[4:] {
		fail(a, now)
	}
	if snap := s.Snapshot(now); snap.Circuit != Closed || snap.ConsecutiveFailures != 0 {
		t.Errorf("expected the circuit closed after the outage's late failures, got %s after %d failures", snap.Circuit, snap.ConsecutiveFailures)
	}
	if r := s.Features(now, 1, false).Reliability; r < 0.999 {
		t.Errorf("expected reliability 1 still, got %v", r)
	}
	a, _ := s.AcquireAttempt(now, 1)
	fail(a, now)
	if c := s.Snapshot(now).Circuit; c != Open {
		t.Errorf("expected a new failure to open the circuit, got %s", c)
	}
}

// Health decays with a half-life: a failure five minutes before a
// success weighs half of it.
func TestHealthDecaysBetweenObservations(t *testing.T) {
	s := NewState()
	s.Observe(t0, provider.NewObservation(provider.Server), DefaultPolicy)
	now := t0.Add(healthHalfLife)
	s.Observe(now, provider.NewObservation(provider.OK), DefaultPolicy)
	// successes 1, attempts 0.5 + 1; with the prior: 2 / 2.5.
	if r := s.Features(now, 1, false).Reliability; !near(r, 0.8) {
		t.Errorf("expected reliability 0.8, got %v", r)
	}
}

// Headroom is the smallest share left over all known windows: a spent
// window makes it 0 whichever window it is, and whatever the others hold.
func TestHeadroomOfASpentWindowIsZero(t *testing.T) {
	both := func(rq, tk int64) provider.Observation {
		o := provider.NewObservation(provider.OK)
		o.Requests = provider.Window{Limit: 10, Remaining: rq, Reset: 30 * time.Second}
		o.Tokens = provider.Window{Limit: 10000, Remaining: tk, Reset: 30 * time.Second}
		return o
	}
	now := t0.Add(time.Second)
	for _, c := range []struct {
		name   string
		rq, tk int64
	}{{"requests spent", 0, 5000}, {"tokens spent", 5, 0}} {
		s := NewState()
		s.Observe(t0, both(c.rq, c.tk), DefaultPolicy)
		if h := s.Features(now, 100, false).Headroom; h != 0 {
			t.Errorf("%s: expected headroom 0, got %v", c.name, h)
		}
	}
}

// A Release with nothing in flight (a double release) does not count
// attempts in flight below zero.
func TestExtraReleaseKeepsInFlight(t *testing.T) {
	s := NewState()
	s.Release()
	if !s.Acquire(t0, 1) {
		t.Fatal("expected the attempt let through")
	}
	if n := s.Features(t0, 1, false).InFlight; n != 1 {
		t.Errorf("expected 1 in flight, got %d", n)
	}
	if n := s.Snapshot(t0).InFlight; n != 1 {
		t.Errorf("snapshot: expected 1 in flight, got %d", n)
	}
}

// An answer to an attempt that was alone in flight (the one before it
// finished, released either way) is taken at its word: the provider's
// count replaces the router's lower one.
func TestALoneAnswerIsTakenAtItsWord(t *testing.T) {
	for _, byAttempt := range []bool{true, false} {
		s := NewState()
		s.Observe(t0, bStatedTokens(1000, 1000, time.Minute), DefaultPolicy)
		t1 := t0.Add(time.Second)
		a, ok := s.AcquireAttempt(t1, 100)
		if !ok {
			t.Fatal("expected the first attempt let through")
		}
		s.ObserveAttempt(a, t1, bStatedTokens(1000, 900, 59*time.Second), DefaultPolicy)
		if byAttempt {
			s.ReleaseAttempt(a)
		} else {
			s.Release()
		}
		t2 := t0.Add(2 * time.Second)
		b, ok := s.AcquireAttempt(t2, 100)
		if !ok {
			t.Fatal("expected the second attempt let through")
		}
		if r := s.Snapshot(t2).RemainingTokens; r != 800 {
			t.Fatalf("expected 800 tokens left as counted locally, got %d", r)
		}
		// The provider counted 50 of it: 850 left, nothing else in flight.
		s.ObserveAttempt(b, t2, bStatedTokens(1000, 850, 58*time.Second), DefaultPolicy)
		if r := s.Snapshot(t2).RemainingTokens; r != 850 {
			t.Errorf("release by attempt %v: expected the stated 850 left, got %d", byAttempt, r)
		}
	}
}

// A success that says more tokens are left than a newer success said is
// older news: it does not refill the tokens window.
func TestStaleSuccessDoesNotRefillTheTokens(t *testing.T) {
	s := NewState()
	s.ObserveAttempt(Attempt{Sent: t0.Add(time.Second)}, t0.Add(1100*time.Millisecond), bStatedTokens(10000, 200, 60*time.Second), DefaultPolicy)
	s.ObserveAttempt(Attempt{Sent: t0}, t0.Add(3*time.Second), bStatedTokens(10000, 5000, 57*time.Second), DefaultPolicy)
	now := t0.Add(3 * time.Second)
	if r := s.Snapshot(now).RemainingTokens; r != 200 {
		t.Errorf("expected the 200 stated by the newer success, got %d", r)
	}
	if at, why := s.AvailableAt(now, 1000); !at.After(now) || why != provider.RateLimited {
		t.Errorf("expected 1000 tokens to wait with 200 left, got %v %s", at.Sub(t0), why)
	}
}

// An operator's drain is told to the fleet; without a fleet it is local.
func TestDisablePublishesTheDrain(t *testing.T) {
	s := NewState()
	s.Disable(t0, true) // no fleet: nothing to tell
	if !s.Disabled() {
		t.Fatal("expected the deployment disabled")
	}
	f := &fakeFleet{}
	s.SetFleet(f)
	n := len(f.published)
	s.Disable(t0.Add(time.Second), false)
	if len(f.published) != n+1 {
		t.Fatalf("expected the drain published, got %+v", f.published[n:])
	}
	if d := f.published[n].Drain; d.Disabled || !d.At.Equal(t0.Add(time.Second)) {
		t.Errorf("expected the enabling at +1 s published, got %+v", d)
	}
}

// The snapshot shows latencies in milliseconds.
func TestSnapshotLatenciesInMilliseconds(t *testing.T) {
	s := NewState()
	s.RecordLatency(2*time.Second, 500*time.Millisecond)
	snap := s.Snapshot(t0)
	if !near(snap.LatencyMS, 2000) || !near(snap.TTFTMS, 500) {
		t.Errorf("expected 2000 ms and 500 ms, got %v %v", snap.LatencyMS, snap.TTFTMS)
	}
}

// bFleet is a fleet whose Spend answers with left, refused or not.
type bFleet struct {
	fakeFleet
	left Budget
}

func (f *bFleet) Spend(b Budget) (time.Duration, Budget, error) {
	f.spends = append(f.spends, b)
	return f.spendWait, f.left, nil
}

// bFleetState is a state whose requests window (100 per minute, 99
// left) is known and spent through fleet f.
func bFleetState(f Fleet) *State {
	s := NewState()
	s.SetFleet(f)
	s.Observe(t0, stated(100, 99, time.Minute), DefaultPolicy)
	return s
}

// bLeft is what the fleet holds of a requests window of 100 after an
// attempt, with instances spending it.
func bLeft(remaining int64, instances int) Budget {
	return Budget{Requests: BudgetWindow{Limit: 100, Remaining: remaining, Reset: t0.Add(time.Minute)},
		Tokens: BudgetWindow{Limit: provider.Unknown}, Instances: instances}
}

// Until an instance learns its share of a fleet's window, it counts on
// an equal one: with two instances, half of what is left.
func TestFleetEqualShareUntilLearned(t *testing.T) {
	f := &bFleet{left: bLeft(90, 2)}
	s := bFleetState(f)
	if !s.Acquire(t0, 1) {
		t.Fatal("expected the attempt let through")
	}
	if r, _ := s.Forecast(t0, t0, 0); r != 45 {
		t.Errorf("expected half of the 90 left (45), got %d", r)
	}
	if r, _ := s.ForecastFleet(t0, t0, 0); r != 90 {
		t.Errorf("expected the fleet's 90, got %d", r)
	}
}

// Once a quarter of the fleet's window is spent, an instance learns its
// share from what it spent: 20 of the 25 spent is 0.8 of what is left.
func TestFleetShareLearnedAtAQuarter(t *testing.T) {
	f := &bFleet{left: bLeft(90, 2)}
	s := bFleetState(f)
	for i := range 19 {
		if !s.Acquire(t0, 1) {
			t.Fatalf("attempt %d refused", i+1)
		}
	}
	if r, _ := s.Forecast(t0, t0, 0); r != 45 {
		t.Fatalf("10 of 100 spent: expected the equal share (45), got %d", r)
	}
	f.left = bLeft(75, 2) // the 20th: 25 of 100 spent, 20 of them here
	if !s.Acquire(t0, 1) {
		t.Fatal("expected the 20th attempt let through")
	}
	if r, _ := s.Forecast(t0, t0, 0); r != 60 {
		t.Errorf("expected 0.8 of the 75 left (60), got %d", r)
	}
}

// Only a window whose length is known is spent through the fleet: one
// stated with a reset of 0 has no span, and stays local.
func TestFleetSpendsOnlyWindowsWithASpan(t *testing.T) {
	f := &fakeFleet{}
	s := NewState()
	s.SetFleet(f)
	s.Observe(t0, stated(10, 5, 0), DefaultPolicy)
	if !s.Acquire(t0, 1) {
		t.Fatal("expected the attempt let through")
	}
	if len(f.spends) != 0 {
		t.Errorf("expected no fleet spend of a window without a span, got %+v", f.spends)
	}
}

// The fleet is asked to reserve a place only for declared limits: a
// deployment without them makes no round trip for it; a declared tpm
// alone is reserved fleet-wide; a reservation granted lets the attempt go.
func TestFleetReservesOnlyDeclaredLimits(t *testing.T) {
	f := &bFleet{left: bLeft(90, 1)}
	s := bFleetState(f)
	if !s.Acquire(t0, 1) {
		t.Fatal("expected the attempt let through")
	}
	if len(f.spends) != 1 || f.reserves != 0 {
		t.Errorf("expected one spend and no reservation, got %d spends, %d reservations", len(f.spends), f.reserves)
	}

	// A declared tpm alone: the fleet's minute is spent, the attempt waits.
	g := &fakeFleet{wait: 5 * time.Second}
	s = NewState()
	s.SetFleet(g)
	s.Declare(0, 1000)
	if s.Acquire(t0, 10) {
		t.Error("expected the fleet's spent tpm to refuse the attempt")
	}
	if g.reserves != 1 {
		t.Errorf("expected one reservation, got %d", g.reserves)
	}
	if at, why := s.AvailableAt(t0, 10); !at.Equal(t0.Add(5*time.Second)) || why != provider.RateLimited {
		t.Errorf("expected to wait 5 s for the fleet, got %v %s", at.Sub(t0), why)
	}

	// A declared rpm that the fleet grants (no wait): the attempt goes.
	h := &fakeFleet{}
	s = NewState()
	s.SetFleet(h)
	s.Declare(10, 0)
	if !s.Acquire(t0, 10) {
		t.Error("expected the fleet's granted reservation to let the attempt through")
	}
	if h.reserves != 1 {
		t.Errorf("expected one reservation, got %d", h.reserves)
	}
}

// bSpendStore records what a Spending writes to its store.
type bSpendStore struct {
	mu    sync.Mutex
	total float64
	adds  int
	ttls  []time.Duration
}

func (f *bSpendStore) AddSpend(_ context.Context, _ string, usd float64, _ SpendOp, ttl time.Duration) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.adds++
	f.ttls = append(f.ttls, ttl)
	f.total += usd
	return f.total, nil
}

func (f *bSpendStore) HoldSpend(context.Context, string, float64, float64, time.Duration) (bool, float64, error) {
	return false, 0, context.Canceled // not used
}

func (f *bSpendStore) Spend(context.Context, string) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total, nil
}

// A fleet's spend total outlives its window: a spend at the window's
// start keeps its key until the window ends (Redis would otherwise drop
// it and the fleet would forget what it spent).
func TestSpendKeyOutlivesItsWindow(t *testing.T) {
	st := &bSpendStore{}
	s := NewSpending(SpendLimit{USD: 10, Period: time.Hour}, st, "b")
	start := t0.Truncate(time.Hour)
	s.Add(start, 1)
	if len(st.ttls) != 1 {
		t.Fatalf("expected one write, got %d", len(st.ttls))
	}
	_, end := s.Over(start)
	if exp := start.Add(st.ttls[0]); exp.Before(end) {
		t.Errorf("the key expires at %v, before its window ends at %v", exp.Sub(start), end.Sub(start))
	}
}

// Adding nothing (a free answer) writes nothing to the fleet's store.
func TestSpendingAddsNothingForFree(t *testing.T) {
	st := &bSpendStore{}
	s := NewSpending(SpendLimit{USD: 10, Period: time.Hour}, st, "b")
	s.Add(t0, 0)
	if st.adds != 0 {
		t.Errorf("expected no write for a cost of 0, got %d", st.adds)
	}
}

// Attempts that left the sliding minute no longer count against the
// declared rpm's forecast: 2 sent at 0 s and 5 at 30 s leave 5 of 10
// at 61 s.
func TestDeclaredForecastForgetsExpiredAttempts(t *testing.T) {
	s := NewState()
	s.Declare(10, 0)
	if got := bAcquireN(s, t0, 2, 1) + bAcquireN(s, t0.Add(30*time.Second), 5, 1); got != 7 {
		t.Fatalf("expected 7 attempts let through, got %d", got)
	}
	now := t0.Add(61 * time.Second)
	if r, _ := s.Forecast(now, now, 0); r != 5 {
		t.Errorf("expected 5 requests left, got %d", r)
	}
	if n := s.Snapshot(now).RequestsLastMinute; n != 5 {
		t.Errorf("expected 5 requests in the last minute, got %d", n)
	}
}

// A stated token limit refuses a larger request only once it is known to
// bound one request: a too_large answer showed it, or its provider type
// said so (BoundsRequest); a larger limit stated later lets larger
// requests fit again; a ratio learned from small answers changes nothing.
func TestFitsTokensOnceTooLargeWasSeen(t *testing.T) {
	s := NewState()
	limit := func(n int64) provider.Observation {
		o := provider.NewObservation(provider.OK)
		o.Tokens = provider.Window{Limit: n, Remaining: n, Reset: time.Second}
		return o
	}
	s.Observe(t0, limit(30000), DefaultPolicy)
	if ok, l := s.FitsTokens(36000); !ok || l != 30000 {
		t.Errorf("a limit alone: expected it to fit (limit 30000), got %v (%d)", ok, l)
	}
	tl := limit(30000)
	tl.Class = provider.TooLarge
	if got := s.Observe(t0, tl, DefaultPolicy); got.Cooldown != 0 {
		t.Errorf("too_large: expected no cooldown, got %v", got.Cooldown)
	}
	if ok, _ := s.FitsTokens(36000); ok {
		t.Error("after too_large: expected 36000 tokens not to fit 30000")
	}
	if ok, _ := s.FitsTokens(29000); !ok {
		t.Error("after too_large: expected 29000 tokens to fit 30000")
	}
	if f := s.Features(t0, 36000, false); !f.TooLarge || f.At.After(t0) {
		t.Errorf("expected the feature TooLarge and no wait for others, got %+v", f)
	}
	s.Observe(t0, limit(100000), DefaultPolicy)
	if ok, _ := s.FitsTokens(36000); !ok {
		t.Error("a raised limit: expected 36000 tokens to fit 100000")
	}

	b := NewState()
	bounds := limit(30000)
	bounds.Tokens.BoundsRequest = true
	for range 3 { // answers that state the same remaining: a ratio near 0
		a, _ := b.AcquireFor(t0, Need{Tokens: 500})
		b.ObserveAttempt(a, t0, bounds, DefaultPolicy)
		b.ReleaseAttempt(a)
	}
	if ok, _ := b.FitsTokens(36000); ok {
		t.Error("a limit that bounds a request: expected 36000 tokens not to fit 30000")
	}
}
