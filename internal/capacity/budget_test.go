package capacity

import (
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// stated is a success stating a requests window.
func stated(limit, remaining int64, reset time.Duration) provider.Observation {
	o := provider.NewObservation(provider.OK)
	o.Requests = provider.Window{Limit: limit, Remaining: remaining, Reset: reset}
	return o
}

func TestAKnownWindowIsFullAgainAfterItsReset(t *testing.T) {
	s := NewState()
	s.Observe(t0, stated(10, 0, 10*time.Second), DefaultPolicy)
	if at, why := s.AvailableAt(t0, 1); !at.Equal(t0.Add(10*time.Second+ResetMargin)) || why != provider.RateLimited {
		t.Fatalf("spent window: expected to wait for the reset, got %v %s", at.Sub(t0), why)
	}
	// After the reset the window holds its limit: ten go at once, the
	// eleventh waits for the next reset, one span (10 s) later.
	t1 := t0.Add(10*time.Second + ResetMargin)
	for i := range 10 {
		if _, ok := s.AcquireAttempt(t1, 1); !ok {
			t.Fatalf("attempt %d refused in a full window", i+1)
		}
	}
	if _, ok := s.AcquireAttempt(t1, 1); ok {
		t.Fatal("an eleventh attempt was let through a window of 10")
	}
	if at, _ := s.AvailableAt(t1, 1); !at.Equal(t0.Add(20*time.Second + 2*ResetMargin)) {
		t.Errorf("expected the next window at +20.1 s (a margin on each reset), got %v", at.Sub(t0))
	}
}

func TestAnswersCorrectTheBudgetWithinWhatTheyCanKnow(t *testing.T) {
	s := NewState()
	s.Observe(t0, stated(10, 10, 10*time.Second), DefaultPolicy)
	send := func(n int) []Attempt {
		var as []Attempt
		for range n {
			a, ok := s.AcquireAttempt(t0, 1)
			if !ok {
				t.Fatal("refused")
			}
			as = append(as, a)
		}
		return as
	}
	answer := func(a Attempt, remaining int64) int64 {
		s.ObserveAttempt(a, t0, stated(10, remaining, 9*time.Second), DefaultPolicy)
		s.ReleaseAttempt(a)
		return s.Snapshot(t0).RemainingRequests
	}
	as := send(10)
	if r := s.Snapshot(t0).RemainingRequests; r != 0 {
		t.Fatalf("ten sent of ten: expected none left before any answer, got %d", r)
	}
	// The last one sent is counted first by the provider and answers
	// first: 9 left as it saw it, but nine others were in flight.
	if r := answer(as[9], 9); r != 0 {
		t.Errorf("an answer that cannot have counted the nine in flight refilled the budget to %d", r)
	}
	for _, a := range as[:9] {
		answer(a, 0)
	}
	// Someone else spends the account: the provider's count is the truth.
	s = NewState()
	s.Observe(t0, stated(10, 10, 10*time.Second), DefaultPolicy)
	as = send(2)
	if r := answer(as[0], 3); r != 3 {
		t.Errorf("expected the provider's 3 (at most what it stated), got %d", r)
	}
	// The router spent more than the provider counted (a token estimate,
	// prompt plus max_tokens, above what the answer used): the provider's
	// count less what it may not have counted yet stands.
	s = NewState()
	tok := provider.NewObservation(provider.OK)
	tok.Tokens = provider.Window{Limit: 10000, Remaining: 10000, Reset: 10 * time.Second}
	s.Observe(t0, tok, DefaultPolicy)
	big, _ := s.AcquireAttempt(t0, 4000)
	if r := s.Snapshot(t0).RemainingTokens; r != 6000 {
		t.Fatalf("expected the estimate spent at once (6000 left), got %d", r)
	}
	tok.Tokens.Remaining = 9900
	s.ObserveAttempt(big, t0, tok, DefaultPolicy)
	if r := s.Snapshot(t0).RemainingTokens; r != 9900 {
		t.Errorf("the answer used 100 tokens: expected 9900 left, got %d", r)
	}
	// An answer older than the last one applied changes nothing.
	s = NewState()
	s.Observe(t0, stated(10, 10, 10*time.Second), DefaultPolicy)
	as = send(2)
	answer(as[1], 8)
	if r := answer(as[0], 9); r != 8 {
		t.Errorf("a stale answer changed the budget to %d", r)
	}
}

func TestARefillingWindowIsPaced(t *testing.T) {
	s := NewState()
	s.Observe(t0, stated(60, 50, 10*time.Second), DefaultPolicy)
	// One second later the provider states more than before, and an
	// earlier time to full: a token bucket refilling at (60-52)/8 = 1/s.
	t1 := t0.Add(time.Second)
	s.Observe(t1, stated(60, 52, 8*time.Second), DefaultPolicy)
	for range 52 {
		if _, ok := s.AcquireAttempt(t1, 1); !ok {
			t.Fatal("refused within the bucket")
		}
	}
	at, _ := s.AvailableAt(t1, 1)
	if !at.Equal(t1.Add(time.Second)) {
		t.Errorf("an empty bucket refilling 1/s: expected the next unit in 1 s, got %v", at.Sub(t1))
	}
	// Paced: two seconds later two units are back, not the whole bucket.
	if r := s.Snapshot(t1.Add(2 * time.Second)).RemainingRequests; r != 2 {
		t.Errorf("expected 2 refilled, got %d", r)
	}
}

func TestAFixedWindowIsNotTakenForABucket(t *testing.T) {
	s := NewState()
	s.Observe(t0, stated(10, 5, 5*time.Second), DefaultPolicy)
	// The provider's window rolled over a little before ours: more left,
	// but the reset moved a whole window later.
	t1 := t0.Add(4 * time.Second)
	s.Observe(t1, stated(10, 9, 10*time.Second), DefaultPolicy)
	for range 9 {
		s.AcquireAttempt(t1, 1)
	}
	if at, _ := s.AvailableAt(t1.Add(5*time.Second), 1); !at.Equal(t1.Add(10*time.Second + ResetMargin)) {
		t.Errorf("a fixed window refills at its reset, got %v", at.Sub(t1))
	}
}

func TestConcurrentFailuresCountOnce(t *testing.T) {
	s := NewState()
	var as []Attempt
	for range 3 {
		s.Observe(t0, provider.NewObservation(provider.OK), DefaultPolicy) // slow start is over
		a, _ := s.AcquireAttempt(t0, 1)
		as = append(as, a)
	}
	for range 3 {
		a, _ := s.AcquireAttempt(t0, 1)
		as = append(as, a)
	}
	// Six streams in flight when the server restarts: one event.
	fail := provider.NewObservation(provider.Transport)
	for _, a := range as {
		s.ObserveAttempt(a, t0.Add(100*time.Millisecond), fail, DefaultPolicy)
		s.ReleaseAttempt(a)
	}
	snap := s.Snapshot(t0.Add(100 * time.Millisecond))
	if snap.ConsecutiveFailures != 1 {
		t.Errorf("expected one failure for one outage, got %d", snap.ConsecutiveFailures)
	}
	if at, _ := s.AvailableAt(t0.Add(100*time.Millisecond), 1); at.Sub(t0) > time.Second {
		t.Errorf("expected the first backoff (0.5 s), got %v", at.Sub(t0))
	}
	// An attempt sent after the failure was seen, failing again, is a
	// second event.
	t1 := t0.Add(time.Second)
	a, ok := s.AcquireAttempt(t1, 1)
	if !ok {
		t.Fatal("the probe was refused")
	}
	s.ObserveAttempt(a, t1, fail, DefaultPolicy)
	if n := s.Snapshot(t1).ConsecutiveFailures; n != 2 {
		t.Errorf("expected 2 after a later failure, got %d", n)
	}
}

func TestSlowStart(t *testing.T) {
	s := NewState()
	var as []Attempt
	for i := range SlowStart {
		a, ok := s.AcquireAttempt(t0, 1)
		if !ok {
			t.Fatalf("attempt %d refused during slow start", i+1)
		}
		as = append(as, a)
	}
	if _, ok := s.AcquireAttempt(t0, 1); ok {
		t.Fatalf("a deployment that never answered took more than %d attempts", SlowStart)
	}
	// Busy, not rate-limited: the router's own pacing.
	if at, why := s.AvailableAt(t0, 1); !at.After(t0) || why != provider.OK {
		t.Errorf("expected a short wait while slow-starting, as busy (ok), got %v %s", at.Sub(t0), why)
	}
	// The first answer states no limits (a local vLLM): full concurrency.
	s.ObserveAttempt(as[0], t0, provider.NewObservation(provider.OK), DefaultPolicy)
	for i := range 50 {
		if _, ok := s.AcquireAttempt(t0, 1); !ok {
			t.Fatalf("attempt %d refused after the first answer", i+1)
		}
	}
	// A deployment whose first answer states a window spends it.
	s = NewState()
	a, _ := s.AcquireAttempt(t0, 1)
	s.ObserveAttempt(a, t0, stated(3, 2, time.Minute), DefaultPolicy)
	s.ReleaseAttempt(a)
	n := 0
	for ; n < 10; n++ {
		if _, ok := s.AcquireAttempt(t0, 1); !ok {
			break
		}
	}
	if n != 2 {
		t.Errorf("expected the stated 2 left to go, got %d", n)
	}
}

func TestReserveKeepsCapacityForHigherPriorities(t *testing.T) {
	s := NewState()
	s.Observe(t0, stated(10, 4, 10*time.Second), DefaultPolicy)
	low := Need{Tokens: 1, Reserve: 0.2} // must leave 2 of 10
	n := 0
	for ; n < 10; n++ {
		if _, ok := s.AcquireFor(t0, low); !ok {
			break
		}
	}
	if n != 2 {
		t.Fatalf("4 left, 2 reserved: expected 2 low-priority attempts, got %d", n)
	}
	if at, _ := s.AvailableFor(t0, low); !at.Equal(t0.Add(10*time.Second + ResetMargin)) {
		t.Errorf("expected low priority to wait for the reset, got %v", at.Sub(t0))
	}
	for i := range 2 {
		if _, ok := s.AcquireFor(t0, Need{Tokens: 1}); !ok {
			t.Fatalf("high-priority attempt %d refused the reserve", i+1)
		}
	}
	// Declared limits keep the same share.
	s = NewState()
	s.Declare(10, 0)
	n = 0
	for ; n < 10; n++ {
		if _, ok := s.AcquireFor(t0, low); !ok {
			break
		}
	}
	if n != 8 {
		t.Errorf("rpm 10 with 20%% reserved: expected 8 low-priority attempts, got %d", n)
	}
}

func TestForecast(t *testing.T) {
	s := NewState()
	s.Observe(t0, stated(10, 3, 10*time.Second), DefaultPolicy)
	for _, c := range []struct {
		until   time.Duration
		reserve float64
		want    int64
	}{
		{5 * time.Second, 0, 3},
		{10 * time.Second, 0, 3}, // the reset is a margin later
		{10*time.Second + ResetMargin, 0, 13},
		{29 * time.Second, 0, 23},
		// Each later reset a span and a margin after the one before
		// (10.05 s, 20.1 s, 30.15 s): the provider's next window starts
		// with the first request after its reset.
		{30*time.Second + ResetMargin, 0, 23},
		{30*time.Second + 3*ResetMargin, 0, 33},
		{30*time.Second + 3*ResetMargin, 0.5, 15},
	} {
		if got, _ := s.Forecast(t0, t0.Add(c.until), c.reserve); got != c.want {
			t.Errorf("until +%v reserve %v: expected %d, got %d", c.until, c.reserve, c.want, got)
		}
	}
	// Nothing known bounds nothing.
	if r, tk := NewState().Forecast(t0, t0.Add(time.Minute), 0); r != provider.Unknown || tk != provider.Unknown {
		t.Errorf("expected unknown, got %d %d", r, tk)
	}
	// Declared rpm: what is left, then a limit per minute.
	d := NewState()
	d.Declare(6, 0)
	for range 4 {
		d.AcquireAttempt(t0, 1)
	}
	if r, _ := d.Forecast(t0, t0.Add(30*time.Second), 0); r != 2 {
		t.Errorf("rpm 6, 4 spent: expected 2 in 30 s, got %d", r)
	}
	if r, _ := d.Forecast(t0, t0.Add(61*time.Second), 0); r != 12 {
		t.Errorf("rpm 6, 4 spent: expected 2 + 4 expired + 6 in 61 s, got %d", r)
	}
	// A circuit open past the horizon lets nothing start.
	s.Observe(t0, provider.Observation{Class: provider.Server, RetryAfter: time.Minute, Requests: provider.UnknownWindow, Tokens: provider.UnknownWindow}, DefaultPolicy)
	if r, _ := s.Forecast(t0, t0.Add(30*time.Second), 0); r != 0 {
		t.Errorf("expected none while the circuit is open, got %d", r)
	}
}

// A token window that counts what answers used, not the router's estimate
// (prompt plus max_tokens), is learned from answers no other attempt
// overlapped: then it admits what it will count, not what was estimated.
func TestATokenWindowLearnsWhatItCounts(t *testing.T) {
	s := NewState()
	tok := func(remaining int64) provider.Observation {
		o := provider.NewObservation(provider.OK)
		o.Tokens = provider.Window{Limit: 1000, Remaining: remaining, Reset: 10 * time.Second}
		return o
	}
	s.Observe(t0, tok(1000), DefaultPolicy)
	// Estimated 600 each (max_tokens 580): only one fits at a time.
	a, _ := s.AcquireAttempt(t0, 600)
	if _, ok := s.AcquireAttempt(t0, 600); ok {
		t.Fatal("two estimates of 600 fit a window of 1000")
	}
	// The provider counted 60 of it.
	s.ObserveAttempt(a, t0, tok(940), DefaultPolicy)
	s.ReleaseAttempt(a)
	n := 0
	for ; n < 100; n++ {
		if _, ok := s.AcquireAttempt(t0, 600); !ok {
			break
		}
	}
	if n != 15 {
		t.Errorf("940 left, 60 counted per attempt: expected 15 more, got %d", n)
	}
	// 40 left until the reset, then 1000: in estimated tokens (0.1 counted
	// per estimated), 400 and 10400.
	if r, tk := s.Forecast(t0, t0.Add(5*time.Second), 0); r != provider.Unknown || tk != 400 {
		t.Errorf("expected 400 estimated tokens until the reset, got %d requests, %d tokens", r, tk)
	}
	if _, tk := s.Forecast(t0, t0.Add(11*time.Second), 0); tk != 10400 {
		t.Errorf("after the reset: expected 10400 estimated tokens, got %d", tk)
	}
}

// Garbage in a provider's headers never blocks a deployment for good: a
// limit of 0 is no budget, a remaining count above the limit is the limit.
func TestGarbageWindowsDoNotBlockForGood(t *testing.T) {
	s := NewState()
	s.Observe(t0, stated(0, 0, 10*time.Second), DefaultPolicy)
	if at, _ := s.AvailableAt(t0.Add(11*time.Second), 1); !at.Equal(t0.Add(11 * time.Second)) {
		t.Errorf("limit 0: expected usable after the stated reset, got %v", at.Sub(t0))
	}
	s = NewState()
	s.Observe(t0, stated(10, 1000, 10*time.Second), DefaultPolicy)
	if r := s.Snapshot(t0).RemainingRequests; r != 10 {
		t.Errorf("remaining 1000 of 10: expected 10, got %d", r)
	}
}

// What a bad statement does wears off: one odd reset of hours weighs on one
// window, not on every one after it; an answer with a count but no reset
// keeps the reset known; a window of unknown limit forecasts nothing past
// its reset; huge limits and slow refills do not overflow.
func TestOddStatementsWearOff(t *testing.T) {
	s := NewState()
	s.Observe(t0, stated(10, 9, 60*time.Second), DefaultPolicy)
	s.Observe(t0, stated(10, 9, 3*time.Hour), DefaultPolicy)
	now := t0
	for i := range 30 { // a request every 10 s, each answered truthfully
		a, ok := s.AcquireAttempt(now, 1)
		if !ok {
			t.Fatalf("attempt %d at +%v refused: one 3 h reset blocked the deployment", i+1, now.Sub(t0))
		}
		s.ObserveAttempt(a, now, stated(10, 9, 59*time.Second), DefaultPolicy)
		s.ReleaseAttempt(a)
		now = now.Add(10 * time.Second)
	}

	s = NewState()
	s.Observe(t0, stated(10, 1, 10*time.Second), DefaultPolicy)
	a, _ := s.AcquireAttempt(t0, 1)
	s.ObserveAttempt(a, t0, stated(10, 0, provider.Unknown), DefaultPolicy)
	if at, _ := s.AvailableAt(t0, 1); !at.Equal(t0.Add(10*time.Second + ResetMargin)) {
		t.Errorf("a count without a reset erased the known reset: available at %v", at.Sub(t0))
	}

	s = NewState()
	s.Observe(t0, stated(provider.Unknown, 0, 10*time.Second), DefaultPolicy)
	if r, _ := s.Forecast(t0, t0.Add(30*time.Second), 0); r != provider.Unknown {
		t.Errorf("a spent window of unknown limit: expected an unknown forecast past its reset, got %d", r)
	}

	s = NewState()
	s.Observe(t0, stated(1<<62, 1<<62, 10*time.Second), DefaultPolicy)
	if r, _ := s.Forecast(t0, t0.Add(time.Hour), 0); r < 1<<40 {
		t.Errorf("a huge limit: expected a huge forecast, got %d", r)
	}
	b := NewState()
	tok := provider.NewObservation(provider.OK)
	tok.Tokens = provider.Window{Limit: 100_000_000, Remaining: 99_000_000, Reset: 100 * time.Hour}
	b.Observe(t0, tok, DefaultPolicy)
	tok.Tokens = provider.Window{Limit: 100_000_000, Remaining: 99_500_000, Reset: 50 * time.Hour}
	b.Observe(t0.Add(time.Hour), tok, DefaultPolicy) // refills continuously, slowly
	if _, ok := b.AcquireAttempt(t0.Add(time.Hour), 99_500_000); !ok {
		t.Fatal("expected the bucket's content taken")
	}
	if at, _ := b.AvailableAt(t0.Add(time.Hour), 50_000_000); !at.After(t0.Add(2 * time.Hour)) {
		t.Errorf("50M tokens at 10k/h: expected a long wait, got %v", at.Sub(t0))
	}
}

// After a span without a request, a window that starts with its next
// request is not taken to reset on the old grid, milliseconds away.
func TestAnIdleWindowStartsWithTheNextRequest(t *testing.T) {
	s := NewState()
	s.Observe(t0, stated(10, 9, 10*time.Second), DefaultPolicy)
	later := t0.Add(45*time.Second + 9800*time.Millisecond) // 0.2 s before a grid reset
	for range 10 {
		if _, ok := s.AcquireAttempt(later, 1); !ok {
			t.Fatal("expected a full window after the idle spell")
		}
	}
	if at, _ := s.AvailableAt(later.Add(time.Second), 1); at.Sub(later) < 10*time.Second {
		t.Errorf("expected the next window a span after the first request, got %v", at.Sub(later))
	}
}
