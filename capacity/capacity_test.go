package capacity

import (
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
	rl := NewObservation(RateLimited)
	rl.RetryAfter = 0
	if got := rl.Cooldown(p, 1); got != 500*time.Millisecond {
		t.Errorf("Retry-After 0 must be floored by the backoff, got %v", got)
	}
	rl.RetryAfter = 20 * time.Second
	rl.Requests = Window{Limit: 3, Remaining: 0, Reset: 25 * time.Second}
	if got := rl.Cooldown(p, 1); got != 25*time.Second {
		t.Errorf("expected the longest of Retry-After and the exhausted window's reset, got %v", got)
	}
	q := NewObservation(QuotaExhausted)
	if got := q.Cooldown(p, 1); got != time.Hour {
		t.Errorf("quota without a reset: expected 1h, got %v", got)
	}
	srv := NewObservation(Server)
	srv.RetryAfter = 30 * time.Second
	if got := srv.Cooldown(Policy{BackoffBase: 2 * time.Second, BackoffMax: time.Minute}, 1); got != 30*time.Second {
		t.Errorf("a 30 s server wait beats a 2 s backoff, got %v", got)
	}
	huge := NewObservation(RateLimited)
	huge.RetryAfter = 1000 * time.Hour
	if got := huge.Cooldown(p, 1); got != MaxCooldown {
		t.Errorf("expected waits clamped to %v, got %v", MaxCooldown, got)
	}
	for _, c := range []Class{OK, ContextLength, ClientError} {
		if got := NewObservation(c).Cooldown(p, 1); got != 0 {
			t.Errorf("%s: expected no cooldown, got %v", c, got)
		}
	}
}

func TestStateAvailability(t *testing.T) {
	s := NewState()
	if at, _ := s.AvailableAt(t0, 100); !at.Equal(t0) {
		t.Fatalf("a new state is usable at once, got %v", at)
	}
	if h := s.Headroom(t0); h != Unknown {
		t.Errorf("nothing known: expected unknown headroom, got %v", h)
	}

	// A success with 0 requests left and a future reset: skip until the reset.
	ok := NewObservation(OK)
	ok.Requests = Window{Limit: 3, Remaining: 0, Reset: 20 * time.Second}
	ok.Tokens = Window{Limit: 40000, Remaining: 5000, Reset: 2 * time.Second}
	s.Observe(t0, ok, DefaultPolicy)
	at, why := s.AvailableAt(t0.Add(time.Second), 100)
	if !at.Equal(t0.Add(20*time.Second)) || why != RateLimited {
		t.Errorf("expected skipped until the reset as rate_limited, got %v %s", at, why)
	}
	if at, _ := s.AvailableAt(t0.Add(21*time.Second), 100); !at.Equal(t0.Add(21 * time.Second)) {
		t.Errorf("after the reset the window is refreshed, got %v", at)
	}

	// Tokens: a request larger than what remains waits for the token reset.
	s = NewState()
	ok = NewObservation(OK)
	ok.Tokens = Window{Limit: 40000, Remaining: 10000, Reset: 30 * time.Second}
	s.Observe(t0, ok, DefaultPolicy)
	if at, _ := s.AvailableAt(t0, 30000); !at.Equal(t0.Add(30 * time.Second)) {
		t.Errorf("30k tokens on 10k left: expected to wait for the reset, got %v", at)
	}
	if at, _ := s.AvailableAt(t0, 5000); !at.Equal(t0) {
		t.Errorf("5k tokens on 10k left: expected at once, got %v", at)
	}
	if h := s.Headroom(t0); h != 0.25 {
		t.Errorf("expected headroom 10000/40000, got %v", h)
	}
}

func TestStateCircuit(t *testing.T) {
	s := NewState()
	fail := NewObservation(Server)
	s.Observe(t0, fail, DefaultPolicy)
	s.Observe(t0, fail, DefaultPolicy)
	at, why := s.AvailableAt(t0, 1)
	if !at.Equal(t0.Add(time.Second)) || why != Server {
		t.Errorf("second consecutive failure: expected 1 s of backoff, got %v %s", at.Sub(t0), why)
	}
	if snap := s.Snapshot(); snap.ConsecutiveFailures != 2 || snap.LastClass != "server" {
		t.Errorf("expected 2 failures recorded, got %+v", snap)
	}
	s.Observe(t0.Add(2*time.Second), NewObservation(OK), DefaultPolicy)
	if at, _ := s.AvailableAt(t0.Add(2*time.Second), 1); !at.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("a success closes the circuit, got %v", at)
	}
	// Client errors say nothing about the deployment.
	s.Observe(t0.Add(3*time.Second), NewObservation(ClientError), DefaultPolicy)
	if snap := s.Snapshot(); snap.ConsecutiveFailures != 0 {
		t.Errorf("a client error is not a failure, got %d", snap.ConsecutiveFailures)
	}
	// A shorter later cooldown never shortens an open circuit.
	s.Observe(t0, Observation{Class: RateLimited, RetryAfter: time.Minute, Requests: UnknownWindow, Tokens: UnknownWindow}, DefaultPolicy)
	s.Observe(t0, Observation{Class: RateLimited, RetryAfter: time.Second, Requests: UnknownWindow, Tokens: UnknownWindow}, DefaultPolicy)
	if at, _ := s.AvailableAt(t0, 1); !at.Equal(t0.Add(time.Minute)) {
		t.Errorf("expected the longer cooldown kept, got %v", at.Sub(t0))
	}
}

func TestClassNames(t *testing.T) {
	for c := OK; c <= ClientError; c++ {
		back, ok := ParseClass(c.String())
		if !ok || back != c {
			t.Errorf("%d: round trip through %q failed", c, c.String())
		}
	}
	if _, ok := ParseClass("nope"); ok {
		t.Error("expected an unknown name rejected")
	}
}
