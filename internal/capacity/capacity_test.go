package capacity

import (
	"github.com/llmrouter/caddy-llm-router/provider"
	"math"

	"testing"
	"time"
)

var t0 = time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)

func TestBackoffDoublesAndCaps(t *testing.T) {
	p := Policy{BackoffBase: 500 * time.Millisecond, BackoffMax: 3 * time.Second}
	for n, want := range map[int]time.Duration{0: 500 * time.Millisecond, 1: 500 * time.Millisecond, 2: time.Second,
		3: 2 * time.Second, 4: 3 * time.Second, 60: 3 * time.Second} {
		if got := p.Backoff(n); got != want {
			t.Errorf("Backoff(%d): expected %v, got %v", n, want, got)
		}
	}
}

func TestCooldownByClass(t *testing.T) {
	p := DefaultPolicy
	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = 0
	if got := p.Cooldown(rl, 1); got != 500*time.Millisecond {
		t.Errorf("Retry-After 0 must be floored by the backoff, got %v", got)
	}
	rl.RetryAfter = 20 * time.Second
	rl.Requests = provider.Window{Limit: 3, Remaining: 0, Reset: 25 * time.Second}
	if got := p.Cooldown(rl, 1); got != 25*time.Second {
		t.Errorf("expected the longest of Retry-After and the exhausted window's reset, got %v", got)
	}
	q := provider.NewObservation(provider.QuotaExhausted)
	if got := p.Cooldown(q, 1); got != time.Hour {
		t.Errorf("quota without a reset: expected 1h, got %v", got)
	}
	srv := provider.NewObservation(provider.Server)
	srv.RetryAfter = 30 * time.Second
	if got := (Policy{BackoffBase: 2 * time.Second, BackoffMax: time.Minute}).Cooldown(srv, 1); got != 30*time.Second {
		t.Errorf("a 30 s server wait beats a 2 s backoff, got %v", got)
	}
	huge := provider.NewObservation(provider.RateLimited)
	huge.RetryAfter = 1000 * time.Hour
	if got := p.Cooldown(huge, 1); got != provider.MaxCooldown {
		t.Errorf("expected waits clamped to %v, got %v", provider.MaxCooldown, got)
	}
	for _, c := range []provider.Class{provider.OK, provider.ContextLength, provider.ClientError} {
		if got := p.Cooldown(provider.NewObservation(c), 1); got != 0 {
			t.Errorf("%s: expected no cooldown, got %v", c, got)
		}
	}
}

func TestStateAvailability(t *testing.T) {
	s := NewState()
	if at, _ := s.AvailableAt(t0, 100); !at.Equal(t0) {
		t.Fatalf("a new state is usable at once, got %v", at)
	}
	if h := s.Features(t0, 0, false).Headroom; h != provider.Unknown {
		t.Errorf("nothing known: expected unknown headroom, got %v", h)
	}

	// A success with 0 requests left and a future reset: skip until the reset.
	ok := provider.NewObservation(provider.OK)
	ok.Requests = provider.Window{Limit: 3, Remaining: 0, Reset: 20 * time.Second}
	ok.Tokens = provider.Window{Limit: 40000, Remaining: 5000, Reset: 2 * time.Second}
	s.Observe(t0, ok, DefaultPolicy)
	at, why := s.AvailableAt(t0.Add(time.Second), 100)
	if !at.Equal(t0.Add(20*time.Second+ResetMargin)) || why != provider.RateLimited {
		t.Errorf("expected skipped until the reset as rate_limited, got %v %s", at, why)
	}
	if at, _ := s.AvailableAt(t0.Add(21*time.Second), 100); !at.Equal(t0.Add(21 * time.Second)) {
		t.Errorf("after the reset the window is refreshed, got %v", at)
	}

	// Tokens: a request larger than what remains waits for the token reset.
	s = NewState()
	ok = provider.NewObservation(provider.OK)
	ok.Tokens = provider.Window{Limit: 40000, Remaining: 10000, Reset: 30 * time.Second}
	s.Observe(t0, ok, DefaultPolicy)
	if at, _ := s.AvailableAt(t0, 30000); !at.Equal(t0.Add(30*time.Second + ResetMargin)) {
		t.Errorf("30k tokens on 10k left: expected to wait for the reset, got %v", at)
	}
	if at, _ := s.AvailableAt(t0, 5000); !at.Equal(t0) {
		t.Errorf("5k tokens on 10k left: expected at once, got %v", at)
	}
	if h := s.Features(t0, 0, false).Headroom; h != 0.25 {
		t.Errorf("expected headroom 10000/40000, got %v", h)
	}
}

func TestStateCircuit(t *testing.T) {
	s := NewState()
	fail := provider.NewObservation(provider.Server)
	s.Observe(t0, fail, DefaultPolicy)
	s.Observe(t0, fail, DefaultPolicy)
	at, why := s.AvailableAt(t0, 1)
	if !at.Equal(t0.Add(time.Second)) || why != provider.Server {
		t.Errorf("second consecutive failure: expected 1 s of backoff, got %v %s", at.Sub(t0), why)
	}
	if snap := s.Snapshot(t0); snap.ConsecutiveFailures != 2 || snap.LastClass == nil || *snap.LastClass != provider.Server {
		t.Errorf("expected 2 failures recorded, got %+v", snap)
	}
	s.Observe(t0.Add(2*time.Second), provider.NewObservation(provider.OK), DefaultPolicy)
	if at, _ := s.AvailableAt(t0.Add(2*time.Second), 1); !at.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("a success closes the circuit, got %v", at)
	}
	// Client errors say nothing about the deployment.
	s.Observe(t0.Add(3*time.Second), provider.NewObservation(provider.ClientError), DefaultPolicy)
	if snap := s.Snapshot(t0); snap.ConsecutiveFailures != 0 {
		t.Errorf("a client error is not a failure, got %d", snap.ConsecutiveFailures)
	}
	// A shorter later cooldown never shortens an open circuit.
	s.Observe(t0, provider.Observation{Class: provider.RateLimited, RetryAfter: time.Minute, Requests: provider.UnknownWindow, Tokens: provider.UnknownWindow}, DefaultPolicy)
	s.Observe(t0, provider.Observation{Class: provider.RateLimited, RetryAfter: time.Second, Requests: provider.UnknownWindow, Tokens: provider.UnknownWindow}, DefaultPolicy)
	if at, _ := s.AvailableAt(t0, 1); !at.Equal(t0.Add(time.Minute)) {
		t.Errorf("expected the longer cooldown kept, got %v", at.Sub(t0))
	}
}

func TestClassNames(t *testing.T) {
	for c := provider.OK; c <= provider.TooLarge; c++ {
		back, ok := provider.ParseClass(c.String())
		if !ok || back != c {
			t.Errorf("%d: round trip through %q failed", c, c.String())
		}
	}
	if _, ok := provider.ParseClass("nope"); ok {
		t.Error("expected an unknown name rejected")
	}
}

func TestHalfOpenLetsOneProbeThrough(t *testing.T) {
	s := NewState()
	s.Observe(t0, provider.NewObservation(provider.Server), DefaultPolicy) // open for 500 ms
	if s.circuit(t0) != Open {
		t.Fatal("expected the circuit open right after the failure")
	}
	later := t0.Add(time.Second)
	if c := s.circuit(later); c != HalfOpen {
		t.Fatalf("expected half-open after the cooldown, got %s", c)
	}
	if !s.Acquire(later, 1) {
		t.Fatal("expected the first request to get the probe")
	}
	if s.Acquire(later, 1) {
		t.Fatal("expected a second request refused while the probe is out")
	}
	if at, _ := s.AvailableAt(later, 1); !at.After(later) {
		t.Errorf("expected others to wait while the probe is out, got %v", at)
	}
	// The probe succeeds: closed, everyone through.
	s.Observe(later, provider.NewObservation(provider.OK), DefaultPolicy)
	s.Release()
	if c := s.circuit(later); c != Closed {
		t.Errorf("expected closed after a successful probe, got %s", c)
	}
	if first, second := s.Acquire(later, 1), s.Acquire(later, 1); !first || !second {
		t.Error("expected a closed circuit to let everyone through")
	}
	s.Release()
	s.Release()

	// A failed probe reopens it for longer.
	s2 := NewState()
	s2.Observe(t0, provider.NewObservation(provider.Server), DefaultPolicy)
	s2.Acquire(t0.Add(time.Second), 1)
	s2.Observe(t0.Add(time.Second), provider.NewObservation(provider.Server), DefaultPolicy)
	s2.Release()
	if at, _ := s2.AvailableAt(t0.Add(time.Second), 1); at.Sub(t0.Add(time.Second)) != time.Second {
		t.Errorf("expected the second failure to open it for 1 s, got %v", at.Sub(t0.Add(time.Second)))
	}
}

func TestRateLimitCircuitClosesAtReset(t *testing.T) {
	s := NewState()
	o := provider.NewObservation(provider.RateLimited)
	o.RetryAfter = 10 * time.Second
	if res := s.Observe(t0, o, DefaultPolicy); !res.Opened || res.Cooldown != 10*time.Second {
		t.Fatalf("expected the circuit opened for 10 s, got %+v", res)
	}
	if c := s.circuit(t0.Add(11 * time.Second)); c != Closed {
		t.Errorf("a rate-limit circuit closes at its reset, got %s", c)
	}
}

func TestOpenedOnlyOnce(t *testing.T) {
	s := NewState()
	auth := provider.NewObservation(provider.Auth)
	if !s.Observe(t0, auth, DefaultPolicy).Opened {
		t.Error("expected the first auth failure to open the circuit")
	}
	if s.Observe(t0.Add(time.Second), auth, DefaultPolicy).Opened {
		t.Error("expected a second auth failure while open not to count as opening (log once)")
	}
}

func TestDeclaredRPMIsASlidingMinute(t *testing.T) {
	s := NewState()
	s.Declare(3, 0)
	for i := 0; i < 3; i++ {
		now := t0.Add(time.Duration(i) * 10 * time.Second)
		if at, _ := s.AvailableAt(now, 1); !at.Equal(now) {
			t.Fatalf("request %d: expected at once, got %v", i, at)
		}
		s.Acquire(now, 1)
		s.Release()
	}
	// The 4th must wait until the 1st is a minute old.
	if at, why := s.AvailableAt(t0.Add(30*time.Second), 1); !at.Equal(t0.Add(time.Minute)) || why != provider.RateLimited {
		t.Errorf("expected to wait until %v, got %v %s", t0.Add(time.Minute), at, why)
	}
	if at, _ := s.AvailableAt(t0.Add(time.Minute+time.Millisecond), 1); !at.Equal(t0.Add(time.Minute + time.Millisecond)) {
		t.Errorf("expected a slot after the first expired, got %v", at)
	}
}

func TestDeclaredTPM(t *testing.T) {
	s := NewState()
	s.Declare(0, 1000)
	s.Acquire(t0, 600)
	s.Acquire(t0.Add(10*time.Second), 300)
	if at, _ := s.AvailableAt(t0.Add(20*time.Second), 200); !at.Equal(t0.Add(time.Minute)) {
		t.Errorf("900 used + 200 > 1000: expected to wait for the first to expire, got %v", at.Sub(t0))
	}
	if at, _ := s.AvailableAt(t0.Add(20*time.Second), 100); !at.Equal(t0.Add(20 * time.Second)) {
		t.Errorf("900 used + 100 fits: expected at once, got %v", at.Sub(t0))
	}
	if h := s.Features(t0.Add(20*time.Second), 50, false).Headroom; h != 0.05 {
		t.Errorf("expected headroom (1000-900-50)/1000, got %v", h)
	}
}

func TestHealthFeatures(t *testing.T) {
	s := NewState()
	if f := s.Features(t0, 0, false); f.Reliability != 1 || f.Latency != 0 {
		t.Errorf("a new deployment: expected reliability 1 and unknown latency, got %+v", f)
	}
	s.Observe(t0, provider.NewObservation(provider.Server), DefaultPolicy)
	s.Observe(t0, provider.NewObservation(provider.OK), DefaultPolicy)
	if f := s.Features(t0, 0, false); f.Reliability != 2.0/3 {
		t.Errorf("1 success of 2 (+1 virtual): expected 2/3, got %v", f.Reliability)
	}
	// An hour later the failure has decayed away.
	if f := s.Features(t0.Add(time.Hour), 0, false); f.Reliability < 0.999 {
		t.Errorf("expected the old failure forgotten, got %v", f.Reliability)
	}
	s.RecordLatency(time.Second, 200*time.Millisecond)
	s.RecordLatency(2*time.Second, 0)
	if f := s.Features(t0, 0, false); f.Latency != 1.3 {
		t.Errorf("expected EWMA 1 + 0.3*(2-1) = 1.3 s, got %v", f.Latency)
	}
	if f := s.Features(t0, 0, true); f.Latency != 0.2 {
		t.Errorf("streaming ranks by TTFT: expected 0.2 s, got %v", f.Latency)
	}
}

func TestAcquireSpendsStatedWindows(t *testing.T) {
	s := NewState()
	ok := provider.NewObservation(provider.OK)
	ok.Requests = provider.Window{Limit: 10, Remaining: 1, Reset: time.Minute}
	s.Observe(t0, ok, DefaultPolicy)
	s.Acquire(t0, 1)
	if at, _ := s.AvailableAt(t0, 1); !at.Equal(t0.Add(time.Minute + ResetMargin)) {
		t.Errorf("the last request is out: expected the next to wait for the reset, got %v", at.Sub(t0))
	}
}

func TestAcquireRechecksTheWindow(t *testing.T) {
	s := NewState()
	s.Declare(1, 0)
	// Two requests saw the deployment free at the same instant: only one
	// gets the last slot.
	if !s.Acquire(t0, 1) {
		t.Fatal("expected the first to get the slot")
	}
	if s.Acquire(t0, 1) {
		t.Error("expected the second refused: rpm 1 is spent")
	}
}

func TestSnapshotShowsRefreshedWindowsFull(t *testing.T) {
	s := NewState()
	o := provider.NewObservation(provider.OK)
	o.Requests = provider.Window{Limit: 3, Remaining: 0, Reset: 10 * time.Second}
	o.Tokens = provider.Window{Limit: provider.Unknown, Remaining: 0, Reset: 10 * time.Second}
	s.Observe(t0, o, DefaultPolicy)
	if r := s.Snapshot(t0).RemainingRequests; r != 0 {
		t.Errorf("expected 0 left before the reset, got %d", r)
	}
	snap := s.Snapshot(t0.Add(11 * time.Second))
	if snap.RemainingRequests != 3 {
		t.Errorf("expected the known limit (3) left after the reset, got %d", snap.RemainingRequests)
	}
	if snap.RemainingTokens != provider.Unknown {
		t.Errorf("a window of unknown limit is unknown after its reset, got %d", snap.RemainingTokens)
	}
}

// An operator's actions: Disable takes the deployment out of ranking,
// Reset forgets its circuit and learned windows (and tells the fleet).
func TestDisableAndReset(t *testing.T) {
	s, f := NewState(), &fakeFleet{}
	s.SetFleet(f)
	s.Disable(time.Now(), true)
	if !s.Features(t0, 1, false).Disabled || !s.Snapshot(t0).Disabled {
		t.Error("expected the deployment disabled")
	}
	s.Disable(time.Now(), false)
	if s.Features(t0, 1, false).Disabled {
		t.Error("expected the deployment enabled again")
	}
	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = time.Hour
	rl.Requests = provider.Window{Limit: 10, Remaining: 0, Reset: time.Hour}
	s.Observe(t0, rl, DefaultPolicy)
	published := len(f.published)
	s.Reset(t0.Add(time.Second))
	snap := s.Snapshot(t0.Add(time.Second))
	if snap.Circuit != Closed || snap.ConsecutiveFailures != 0 || snap.LimitRequests != provider.Unknown || snap.RemainingRequests != provider.Unknown {
		t.Errorf("expected the circuit and windows forgotten, got %+v", snap)
	}
	if at, _ := s.AvailableAt(t0.Add(time.Second), 1); !at.Equal(t0.Add(time.Second)) {
		t.Errorf("expected usable at once, got %v", at.Sub(t0))
	}
	if len(f.published) != published+1 || f.published[len(f.published)-1].Circuit.At.IsZero() {
		t.Errorf("expected the reset published to the fleet, got %+v", f.published[published:])
	}
}

// A deployment's usage: its total, the last hour by whole minutes (what
// is older drops out), and its failovers by class, only those that
// happened.
func TestUsageLedger(t *testing.T) {
	s := NewState()
	t0 := time.Date(2026, 11, 30, 10, 0, 30, 0, time.UTC)
	s.RecordUsage(t0, provider.Usage{InputTokens: 10, OutputTokens: 1}, 0.5)
	s.RecordUsage(t0.Add(30*time.Minute), provider.Usage{InputTokens: 20, CachedInputTokens: 5, OutputTokens: 2}, 0.25)
	s.RecordFailover(provider.RateLimited)
	s.RecordFailover(provider.RateLimited)
	s.RecordFailover(provider.Overloaded)
	r := s.Usage(t0.Add(59 * time.Minute))
	if r.Total.Answers != 2 || r.Total.InputTokens != 30 || r.Total.CostUSD != 0.75 || r.LastHour != r.Total {
		t.Errorf("at 59 min: %+v", r)
	}
	if len(r.Failovers) != 2 || r.Failovers["rate_limited"] != 2 || r.Failovers["overloaded"] != 1 {
		t.Errorf("failovers %v", r.Failovers)
	}
	r = s.Usage(t0.Add(60 * time.Minute))
	if r.LastHour.Answers != 1 || r.LastHour.InputTokens != 20 || r.LastHour.CachedInputTokens != 5 || r.Total.Answers != 2 {
		t.Errorf("at 60 min: the first minute has dropped out of the last hour: %+v", r)
	}
	if r = s.Usage(t0.Add(-time.Minute)); r.LastHour.Answers != 0 {
		t.Errorf("before anything was recorded: %+v", r.LastHour)
	}
	// Saturating: a provider's garbage does not wrap a total negative.
	s.RecordUsage(t0, provider.Usage{InputTokens: math.MaxInt64}, 0)
	if r = s.Usage(t0); r.Total.InputTokens != math.MaxInt64 {
		t.Errorf("saturated %d", r.Total.InputTokens)
	}
}
