package capacity

import (
	"github.com/llmrouter/caddy-llm-router/provider"

	"errors"
	"testing"
	"time"
)

// fakeFleet records what a State asks of its fleet and answers as told.
type fakeFleet struct {
	published []Shared
	reserves  int
	wait      time.Duration
	err       error
	probeFree bool
	claims    int
	released  int
	spends    []Budget
	spendWait time.Duration
	left      Budget
}

func (f *fakeFleet) Publish(sh Shared) { f.published = append(f.published, sh) }
func (f *fakeFleet) Reserve(rpm, tpm, tokens int64) (time.Duration, error) {
	f.reserves++
	return f.wait, f.err
}
func (f *fakeFleet) ClaimProbe() (bool, error) {
	f.claims++
	return f.probeFree, f.err
}
func (f *fakeFleet) ReleaseProbe() { f.released++ }
func (f *fakeFleet) Spend(b Budget) (time.Duration, Budget, error) {
	f.spends = append(f.spends, b)
	if f.err != nil || f.spendWait > 0 {
		return f.spendWait, Budget{}, f.err
	}
	return 0, f.left, nil
}

func TestFleetPublishesWhatObserveChanged(t *testing.T) {
	s, f := NewState(), &fakeFleet{}
	s.SetFleet(f)
	if len(f.published) != 0 {
		t.Fatalf("a state that learned nothing publishes nothing, got %+v", f.published)
	}
	s.Observe(t0, provider.NewObservation(provider.OK), DefaultPolicy)
	if len(f.published) != 0 {
		t.Errorf("a success that changes nothing publishes nothing, got %+v", f.published)
	}
	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = 20 * time.Second
	s.Observe(t0, rl, DefaultPolicy)
	if len(f.published) != 1 {
		t.Fatalf("expected the opened circuit published, got %+v", f.published)
	}
	c := f.published[0].Circuit
	if !c.At.Equal(t0) || !c.OpenUntil.Equal(t0.Add(20*time.Second)) || c.Reason != provider.RateLimited || c.Failures != 1 {
		t.Errorf("expected open until +20s for rate_limited, got %+v", c)
	}
	if !f.published[0].Requests.At.IsZero() {
		t.Error("expected no window published when no header said anything")
	}
	ok := provider.NewObservation(provider.OK)
	ok.Requests = provider.Window{Limit: 10, Remaining: 9, Reset: time.Second}
	s.Observe(t0.Add(time.Second), ok, DefaultPolicy)
	last := f.published[len(f.published)-1]
	if last.Requests.Remaining != 9 || last.Circuit.OpenUntil != (time.Time{}) || last.Circuit.At.IsZero() {
		t.Errorf("expected the closed circuit and the window published, got %+v", last)
	}
}

func TestFleetMergeNewestWins(t *testing.T) {
	s := NewState()
	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = 20 * time.Second
	s.Observe(t0, rl, DefaultPolicy)
	// Older news loses.
	if s.Merge(Shared{Circuit: SharedCircuit{At: t0.Add(-time.Second)}}) {
		t.Error("expected older news ignored")
	}
	if at, _ := s.AvailableAt(t0, 0); !at.Equal(t0.Add(20 * time.Second)) {
		t.Errorf("expected still open, got %v", at)
	}
	// Newer news wins: another instance's success closed it.
	if !s.Merge(Shared{Circuit: SharedCircuit{At: t0.Add(time.Second)}}) {
		t.Error("expected newer news merged")
	}
	if at, _ := s.AvailableAt(t0.Add(2*time.Second), 0); !at.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("expected closed after the merge, got %v", at)
	}
	s.Merge(Shared{Tokens: SharedWindow{At: t0.Add(3 * time.Second), Limit: 1000, Remaining: 0, Reset: t0.Add(30 * time.Second)}})
	if at, why := s.AvailableAt(t0.Add(3*time.Second), 10); !at.Equal(t0.Add(30*time.Second)) || why != provider.RateLimited {
		t.Errorf("expected the merged empty token window to wait until its reset, got %v %s", at, why)
	}
	if sh := s.Shared(); !sh.Tokens.At.Equal(t0.Add(3*time.Second)) || !sh.Circuit.At.Equal(t0.Add(time.Second)) {
		t.Errorf("expected Shared to date each part as learned, got %+v", sh)
	}
}

func TestFleetReserveDeniedWaitsAndFallsBack(t *testing.T) {
	s, f := NewState(), &fakeFleet{wait: 40 * time.Second}
	s.Declare(10, 0)
	s.SetFleet(f)
	if s.Acquire(t0, 1) {
		t.Fatal("expected the fleet's spent window to refuse")
	}
	if at, why := s.AvailableAt(t0, 1); !at.Equal(t0.Add(40*time.Second)) || why != provider.RateLimited {
		t.Errorf("expected a wait of the fleet's 40 s, got %v %s", at, why)
	}
	if snap := s.Snapshot(t0); snap.InFlight != 0 || snap.RequestsLastMinute != 0 {
		t.Errorf("a refused attempt counts nowhere, got %+v", snap)
	}
	f.wait, f.err = 0, errors.New("down")
	if !s.Acquire(t0.Add(40*time.Second), 1) {
		t.Error("expected a local decision when the fleet cannot answer")
	}
	s.Release()
	// No declared limit and a closed circuit: the fleet is not asked.
	s2, f2 := NewState(), &fakeFleet{}
	s2.SetFleet(f2)
	s2.Acquire(t0, 1)
	if f2.reserves+f2.claims != 0 {
		t.Errorf("expected no request-path call without declared limits, got %d", f2.reserves+f2.claims)
	}
}

func TestFleetProbe(t *testing.T) {
	p := Policy{BackoffBase: time.Second, BackoffMax: time.Second, Long: time.Hour}
	half := func(f *fakeFleet) *State {
		s := NewState()
		s.SetFleet(f)
		s.Observe(t0, provider.NewObservation(provider.Server), p)
		return s
	}
	now := t0.Add(2 * time.Second)

	f := &fakeFleet{probeFree: false}
	s := half(f)
	if s.Acquire(now, 0) {
		t.Fatal("expected refused: another instance probes")
	}
	if at, _ := s.AvailableAt(now, 0); !at.Equal(now.Add(probeWait)) {
		t.Errorf("expected to wait %v for the other probe, got %v", probeWait, at.Sub(now))
	}
	if at, _ := s.AvailableAt(now.Add(probeWait), 0); !at.Equal(now.Add(probeWait)) {
		t.Error("expected to ask again once the wait passed")
	}

	f = &fakeFleet{probeFree: true}
	s = half(f)
	if !s.Acquire(now, 0) {
		t.Fatal("expected the probe")
	}
	if s.Acquire(now, 0) {
		t.Error("expected one probe at a time here too")
	}
	s.Observe(now, provider.NewObservation(provider.OK), p)
	s.Release()
	if f.claims != 1 || f.released != 1 {
		t.Errorf("expected one claim released once, got %d claims, %d releases", f.claims, f.released)
	}

	// A release without an observation (the client left) frees the claim too.
	f = &fakeFleet{probeFree: true}
	s = half(f)
	s.Acquire(now, 0)
	s.Release()
	if f.released != 1 {
		t.Errorf("expected the claim freed on Release, got %d", f.released)
	}
}

// A reload to another store binds the state to it; when that store goes
// away unused (the new config failed to load), the state works alone until
// the store still in use adopts it again, which no other store can while
// one holds it.
func TestFleetRebinding(t *testing.T) {
	s, old, next := NewState(), &fakeFleet{wait: time.Second}, &fakeFleet{}
	s.Declare(5, 0)
	s.SetFleet(old)
	s.SetFleet(next)
	s.Acquire(t0, 1)
	if next.reserves != 1 || old.reserves != 0 {
		t.Fatalf("expected the last bound store used, got old %d next %d", old.reserves, next.reserves)
	}
	s.ClearFleet(old) // not the one holding it: no change
	s.Acquire(t0, 1)
	if next.reserves != 2 {
		t.Fatalf("expected next still used, got %d", next.reserves)
	}
	// The new config failed to load: its store lets go.
	s.ClearFleet(next)
	if !s.Acquire(t0, 1) || old.reserves != 0 || next.reserves != 2 {
		t.Fatalf("expected the state to work alone, got old %d next %d", old.reserves, next.reserves)
	}
	if !s.AdoptFleet(old) || s.AdoptFleet(next) {
		t.Fatal("expected the old store to adopt the unbound state, and no other store then")
	}
	s.Acquire(t0, 1)
	if old.reserves != 1 || next.reserves != 2 {
		t.Errorf("expected the old store used again, got old %d next %d", old.reserves, next.reserves)
	}
}

// A success speaks for when its attempt was sent: one sent before a 429 was
// learned (here, or from another instance) neither closes the circuit nor
// refills the window; it publishes its closing of a circuit dated by when
// it was sent, so that another instance's newer 429 stands.
func TestLateSuccessSpeaksForItsSending(t *testing.T) {
	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = 60 * time.Second
	rl.Requests = provider.Window{Limit: 100, Remaining: 0, Reset: 60 * time.Second}
	ok := provider.NewObservation(provider.OK)
	ok.Requests = provider.Window{Limit: 100, Remaining: 7, Reset: 50 * time.Second}

	s := NewState()
	s.Observe(t0.Add(50*time.Millisecond), rl, DefaultPolicy)
	s.ObserveAttempt(Attempt{Sent: t0.Add(10 * time.Millisecond)}, t0.Add(510*time.Millisecond), ok, DefaultPolicy)
	if at, why := s.AvailableAt(t0.Add(time.Second), 0); !at.Equal(t0.Add(60050*time.Millisecond+ResetMargin)) || why != provider.RateLimited {
		t.Errorf("expected the 429 to stand until 60.05 s, got %v %s", at.Sub(t0), why)
	}
	if snap := s.Snapshot(t0.Add(time.Second)); snap.RemainingRequests != 0 || snap.Circuit != Open {
		t.Errorf("expected the window still empty and the circuit open, got %+v", snap)
	}
	// A success sent after the 429 was learned proves it is over.
	s.ObserveAttempt(Attempt{Sent: t0.Add(100 * time.Millisecond)}, t0.Add(200*time.Millisecond), ok, DefaultPolicy)
	if at, _ := s.AvailableAt(t0.Add(time.Second), 0); !at.Equal(t0.Add(time.Second)) {
		t.Errorf("expected a success sent after the 429 to close the circuit, got %v", at.Sub(t0))
	}

	// Fleet: b had a failure, then a success sent at 10 ms closes its
	// circuit; what it publishes is dated 10 ms, older than a's 429.
	b, f := NewState(), &fakeFleet{}
	b.SetFleet(f)
	b.Observe(t0.Add(-time.Second), provider.NewObservation(provider.Server), DefaultPolicy)
	b.ObserveAttempt(Attempt{Sent: t0.Add(10 * time.Millisecond)}, t0.Add(510*time.Millisecond), ok, DefaultPolicy)
	last := f.published[len(f.published)-1]
	if !last.Circuit.At.Equal(t0.Add(10*time.Millisecond)) || !last.Circuit.OpenUntil.IsZero() {
		t.Fatalf("expected the closing dated by the sending, got %+v", last.Circuit)
	}
	a := NewState()
	a.Observe(t0.Add(50*time.Millisecond), rl, DefaultPolicy)
	if a.Merge(last) {
		t.Error("expected another instance's late success not to clear a newer 429")
	}
	if at, _ := a.AvailableAt(t0.Add(time.Second), 0); !at.Equal(t0.Add(60050*time.Millisecond + ResetMargin)) {
		t.Errorf("expected a's 429 to stand, got %v", at.Sub(t0))
	}
}

// A success that says more is left than a newer success said is older
// news: it does not refill the window.
func TestStaleSuccessDoesNotRefillALowWindow(t *testing.T) {
	okWith := func(rem int64, reset time.Duration) provider.Observation {
		o := provider.NewObservation(provider.OK)
		o.Requests = provider.Window{Limit: 100, Remaining: rem, Reset: reset}
		return o
	}
	s := NewState()
	s.ObserveAttempt(Attempt{Sent: t0.Add(time.Second)}, t0.Add(1100*time.Millisecond), okWith(2, 60*time.Second), DefaultPolicy)
	s.ObserveAttempt(Attempt{Sent: t0}, t0.Add(3*time.Second), okWith(50, 57*time.Second), DefaultPolicy)
	now := t0.Add(3 * time.Second)
	if snap := s.Snapshot(now); snap.RemainingRequests != 2 {
		t.Errorf("expected the 2 stated by the newer success, got %d", snap.RemainingRequests)
	}
	n := 0
	for i := 0; i < 5; i++ {
		if s.Acquire(now, 1) {
			n++
		}
	}
	if n != 2 {
		t.Errorf("expected 2 acquisitions with 2 left, got %d", n)
	}
}

// A deployment whose window is known spends it through the fleet: the
// fleet's count becomes the state's, and a fleet that says the window is
// spent refuses the attempt until its reset.
func TestFleetBudget(t *testing.T) {
	s, f := NewState(), &fakeFleet{}
	s.SetFleet(f)
	s.Acquire(t0, 100) // nothing known yet: the fleet holds no budget
	if len(f.spends) != 0 {
		t.Fatalf("expected no spend while the window is unknown, got %+v", f.spends)
	}
	ok := provider.NewObservation(provider.OK)
	ok.Requests = provider.Window{Limit: 10, Remaining: 9, Reset: 10 * time.Second}
	s.Observe(t0, ok, DefaultPolicy)
	f.left = Budget{Requests: BudgetWindow{Limit: 10, Remaining: 3, Reset: t0.Add(10 * time.Second)}, Tokens: BudgetWindow{Limit: provider.Unknown}}
	if !s.Acquire(t0, 100) {
		t.Fatal("expected the attempt let through")
	}
	sp := f.spends[len(f.spends)-1]
	if sp.Requests.Limit != 10 || sp.Requests.Remaining != 9 || sp.Requests.N != 1 || sp.Tokens.Limit != provider.Unknown ||
		!sp.Requests.Reset.Equal(t0.Add(10*time.Second+ResetMargin)) || sp.Requests.Span != 10*time.Second {
		t.Errorf("expected the requests window asked for, got %+v", sp)
	}
	if r := s.Snapshot(t0).RemainingRequests; r != 3 {
		t.Errorf("expected the fleet's 3 left, got %d", r)
	}
	// Two instances spend the window: until this one learns its share, it
	// forecasts half of what is left and of each window to come.
	f.left.Instances = 2
	if !s.Acquire(t0, 100) {
		t.Fatal("expected the attempt let through")
	}
	if r, _ := s.Forecast(t0, t0.Add(25*time.Second), 0); r != 11 {
		t.Errorf("expected half of 3 + 2 windows of 10 (11), got %d", r)
	}
	// A place counted in the fleet's queue is measured against the
	// fleet's whole windows.
	if r, _ := s.ForecastFleet(t0, t0.Add(25*time.Second), 0); r != 23 {
		t.Errorf("expected the fleet's 3 + 2 windows of 10 (23), got %d", r)
	}
	f.spendWait = 4 * time.Second
	if s.Acquire(t0, 100) {
		t.Fatal("expected the attempt refused by the fleet")
	}
	if at, why := s.AvailableAt(t0, 100); !at.Equal(t0.Add(4*time.Second)) || why != provider.RateLimited {
		t.Errorf("expected to wait for the fleet's reset, got %v %s", at.Sub(t0), why)
	}
	// An unreachable fleet leaves the decision to local knowledge.
	f.spendWait, f.err = 0, errors.New("down")
	if !s.Acquire(t0.Add(5*time.Second), 100) {
		t.Error("expected local knowledge to let the attempt through")
	}
}

// Two instances spend one fixed window of 10 requests per 4 s that starts
// at its first request (llm_mock's), as TestFleetOnARedisCluster does. In
// a burst, the other instance's answer (3 left, its attempt sent at 5 ms)
// reaches this one (Merge) before this instance's own answer to an
// attempt it sent at 10 ms, which the provider admitted earlier (6 left).
// 6 is more than the 3 last stated plus what this instance had in flight,
// but the other instance's attempts, which this one does not count, came
// between: no evidence of a bucket. Read as one, the window left the
// fleet's budget (a bucket is not leased), and the instance spent the rest
// of the burst on its own count: 12-15 sent within the provider's window
// of 10, the 429s at the end of the burst.
func TestAnotherInstancesCountProvesNoBucket(t *testing.T) {
	ok := okOfTen
	s, f := NewState(), &fakeFleet{}
	s.SetFleet(f)
	warm, _ := s.AcquireFor(t0, Need{})
	s.ObserveAttempt(warm, t0.Add(10*time.Millisecond), ok(9, 3990*time.Millisecond), DefaultPolicy)
	s.ReleaseAttempt(warm)

	burst := t0.Add(4200 * time.Millisecond) // the warm-up's window ended
	ms := func(n int) time.Time { return burst.Add(time.Duration(n) * time.Millisecond) }
	f.left = Budget{Requests: BudgetWindow{Limit: 10, Remaining: 8, Reset: ms(4050), Span: 4 * time.Second},
		Tokens: BudgetWindow{Limit: provider.Unknown}, Instances: 2}
	s.Merge(Shared{Requests: SharedWindow{At: ms(5), Limit: 10, Remaining: 3, Reset: ms(4055)}})
	a, got := s.AcquireFor(ms(10), Need{})
	if !got || len(f.spends) != 1 {
		t.Fatalf("expected the attempt granted by the fleet, got %v after %d spends", got, len(f.spends))
	}
	s.ObserveAttempt(a, ms(40), ok(6, 3970*time.Millisecond), DefaultPolicy)
	s.ReleaseAttempt(a)

	// The fleet's window is spent: the next attempt asks it, and waits.
	f.spendWait = 3900 * time.Millisecond
	if _, got := s.AcquireFor(ms(50), Need{}); got || len(f.spends) != 2 {
		t.Errorf("expected the next attempt to ask the fleet (2 spends) and be refused, got %v after %d spends", got, len(f.spends))
	}
	if at, why := s.AvailableAt(ms(50), 0); !at.Equal(ms(3950)) || why != provider.RateLimited {
		t.Errorf("expected the deployment out until the fleet's window ends (3.95 s), got %v %s", at.Sub(burst), why)
	}
}

// A fixed window the fleet's budget rolled (its reset a window later:
// leaseScript's roll) starts a new count: the next answer's larger count
// is the new window's, not a refill of the old one's last statement.
// Before, the old window's statement (2 left) stood as the baseline, the
// new window's 9 read as a refill before the reset, and the window was
// taken for a bucket, which the fleet then leased as one for every
// instance (trial38: a fixed window of 20 per 10 s held as a bucket, an
// upstream 429 about 2 s into every window for 80 s).
func TestAFleetWindowRollIsNoRefill(t *testing.T) {
	ok := okOfTen
	s, f := NewState(), &fakeFleet{}
	s.SetFleet(f)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	f.left = Budget{Requests: BudgetWindow{Limit: 10, Remaining: 8, Reset: ms(4000), Span: 4 * time.Second},
		Tokens: BudgetWindow{Limit: provider.Unknown}, Instances: 2}
	a, got := s.AcquireFor(t0, Need{})
	if !got {
		t.Fatal("expected the first attempt granted")
	}
	// The other instance spent most of it; this instance reads its end a
	// little later than the fleet's budget has it (each anchors its own).
	s.ObserveAttempt(a, ms(10), ok(2, 4300*time.Millisecond), DefaultPolicy)
	s.ReleaseAttempt(a)
	// The window ended; the fleet's budget starts the next one with this
	// attempt, a span later.
	for i, at := range []int{4200, 4230} {
		f.left = Budget{Requests: BudgetWindow{Limit: 10, Remaining: int64(9 - i), Reset: ms(8200), Span: 4 * time.Second},
			Tokens: BudgetWindow{Limit: provider.Unknown}, Instances: 2}
		b, got := s.AcquireFor(ms(at), Need{})
		if !got {
			t.Fatalf("expected the attempt at %d ms granted by the fleet", at)
		}
		s.ObserveAttempt(b, ms(at+50), ok(int64(9-i), time.Duration(8200-at-50)*time.Millisecond), DefaultPolicy)
		s.ReleaseAttempt(b)
	}
	if s.requests.refilling() {
		t.Errorf("expected the window still fixed after the fleet's roll, taken for a bucket of %.2f a second", s.requests.rate)
	}
	f.left.Requests.Remaining = 7
	if _, got := s.AcquireFor(ms(4300), Need{}); !got || f.spends[len(f.spends)-1].Requests.Rate != 0 {
		t.Errorf("expected the next attempt to ask the fleet for a fixed window (rate 0), got %v with %+v", got, f.spends[len(f.spends)-1].Requests)
	}
}

// A window its statements proved fixed (9 left in 10 s and 5 left in 6 s
// imply rates no bucket states together) is not taken for a bucket by a
// later count larger than the last before its reset (what another
// instance's count, or a roll this one did not see, states): before, it
// was, and the fleet then leased it as a bucket for every instance. It
// asks the fleet for a fixed window, Fixed: the fleet's budget holds it
// as one whatever another instance read.
func TestAProvedFixedWindowStaysFixed(t *testing.T) {
	ok := okOfTen
	s := NewState()
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, st := range []struct {
		at     int
		left   int64
		resets time.Duration
	}{{0, 9, 10 * time.Second}, {4000, 5, 6 * time.Second}} {
		a, got := s.AcquireFor(ms(st.at), Need{})
		if !got {
			t.Fatalf("expected the attempt at %d ms to go", st.at)
		}
		s.ObserveAttempt(a, ms(st.at+10), ok(st.left, st.resets-10*time.Millisecond), DefaultPolicy)
		s.ReleaseAttempt(a)
	}
	if !s.requests.fixed {
		t.Fatal("expected the two statements to prove the window fixed")
	}
	a, _ := s.AcquireFor(ms(5000), Need{})
	s.ObserveAttempt(a, ms(5010), ok(8, 4990*time.Millisecond), DefaultPolicy)
	s.ReleaseAttempt(a)
	if s.requests.refilling() {
		t.Errorf("expected the proved fixed window still fixed, taken for a bucket of %.2f a second", s.requests.rate)
	}
	f := &fakeFleet{left: Budget{Requests: BudgetWindow{Limit: 10, Remaining: 5, Reset: ms(10000), Span: 10 * time.Second},
		Tokens: BudgetWindow{Limit: provider.Unknown}, Instances: 2}}
	s.SetFleet(f)
	if _, got := s.AcquireFor(ms(5100), Need{}); !got || len(f.spends) != 1 || !f.spends[0].Requests.Fixed || f.spends[0].Requests.Rate != 0 {
		t.Errorf("expected the fleet asked for a proved fixed window, got %v after %+v", got, f.spends)
	}
}

// Answers of one instant's burst come in any order, and in fleet mode
// another instance's attempts are admitted between this one's: a fixed
// window that states "12 left, full at 10 s" then "19 left, full at 10 s"
// (the same instant: the same window) is not refilling, whatever this
// instance sent meanwhile. Before, a count larger than the last by more
// than this instance's later attempts, before the reset, proved a
// bucket: trial38b saw a fleet's fixed window of 20 per 10 s taken for a
// bucket of 0.1 a second in 3 of 12 series of bursts (0-8 served a
// window after, of 20).
func TestOutOfOrderAnswersOfOneInstantAreNoRefill(t *testing.T) {
	s, f := NewState(), &fakeFleet{}
	s.SetFleet(f)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	// The fleet's budget starts the window with the burst (leaseScript's
	// roll: a span and the margin after its first call).
	f.left = Budget{Requests: BudgetWindow{Limit: 20, Remaining: 16, Reset: t0.Add(10*time.Second + ResetMargin), Span: 10 * time.Second},
		Tokens: BudgetWindow{Limit: provider.Unknown}, Instances: 2}
	var as []Attempt
	for range 4 {
		a, got := s.AcquireFor(t0, Need{})
		if !got {
			t.Fatal("expected the burst's attempts to go")
		}
		as = append(as, a)
	}
	// The provider's window starts with the burst: every countdown is
	// 10 s from the same instant; the other instance's attempts were
	// admitted between this one's.
	for i, left := range []int64{12, 19, 15, 17} {
		o := provider.NewObservation(provider.OK)
		// llm_mock's OpenAI countdown of a window begun this millisecond:
		// "10s" (the format's whole seconds at the window's start)
		o.Requests = provider.Window{Limit: 20, Remaining: left, Reset: 10 * time.Second, Resolution: time.Second}
		s.ObserveAttempt(as[i], ms(200+3*i), o, DefaultPolicy)
		s.ReleaseAttempt(as[i])
	}
	if s.requests.refilling() {
		t.Errorf("expected the window still fixed after one instant's answers in another order, taken for a bucket of %.2f a second", s.requests.rate)
	}
}

// okOfTen is an answer that states a request window of 10 with remaining
// left, full again in reset (to the millisecond).
func okOfTen(remaining int64, reset time.Duration) provider.Observation {
	o := provider.NewObservation(provider.OK)
	o.Requests = provider.Window{Limit: 10, Remaining: remaining, Reset: reset, Resolution: time.Millisecond}
	return o
}
