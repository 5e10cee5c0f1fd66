package capacity

import (
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// A token bucket of 4,000 per 10 s (400 a second, Anthropic's: the
// reset an RFC 3339 instant in whole seconds, rounded up, read against a
// Date in whole seconds) under a burst of four attempts of 949 tokens
// sent at one instant: its answers state "3051 left, full at 14 s", "2102,
// 16 s", "1153, 19 s", "204, 21 s". The third came back first; the first
// two, sent before it, came after it: stale for the count, but an earlier
// reset with more left, at the rate the third's implies, is a bucket's
// (resets 2 s apart, each ±2 s, are too loose to tell a bucket from a
// fixed window: the first two's are the evidence). Skipped whole, they
// left the window read as fixed, full again at 19 s: the next attempt
// waited 8 s, and then four went at once into a bucket that held three
// (the simulation's token-window, seed 13: an upstream 429, 8 served of
// an ideal 12).
func TestAStaleAnswerStillProvesABucket(t *testing.T) {
	const cost = 949
	stating := func(remaining int64, full, admitted time.Duration) provider.Observation {
		o := provider.NewObservation(provider.OK)
		date := t0.Add(admitted).Truncate(time.Second)
		o.Tokens = provider.Window{Limit: 4000, Remaining: remaining, Reset: t0.Add(full).Sub(date),
			Instant: true, Resolution: time.Second}
		return o
	}
	s := NewState()
	warm, _ := s.AcquireAttempt(t0, cost)
	s.ObserveAttempt(warm, t0.Add(140*time.Millisecond), stating(3051, 3*time.Second, 0), DefaultPolicy)
	s.ReleaseAttempt(warm)

	burst := 11140 * time.Millisecond
	var as []Attempt
	for range 4 {
		a, ok := s.AcquireAttempt(t0.Add(burst), cost)
		if !ok {
			t.Fatalf("attempt %d of the burst refused on a full bucket", len(as))
		}
		as = append(as, a)
	}
	answers := []struct {
		i         int
		remaining int64
		full, at  time.Duration
	}{
		{2, 1153, 19 * time.Second, 11277 * time.Millisecond},
		{0, 3051, 14 * time.Second, 11278 * time.Millisecond},
		{3, 204, 21 * time.Second, 11286 * time.Millisecond},
		{1, 2102, 16 * time.Second, 11288 * time.Millisecond},
	}
	for _, ans := range answers {
		s.ObserveAttempt(as[ans.i], t0.Add(ans.at), stating(ans.remaining, ans.full, burst), DefaultPolicy)
		s.ReleaseAttempt(as[ans.i])
	}
	now := t0.Add(11288 * time.Millisecond)
	// The bucket holds 949 again at 11.14 s + 745/400 s = 13.0 s.
	at, _ := s.AvailableAt(now, cost)
	if at.Before(t0.Add(13 * time.Second)) {
		t.Errorf("the next attempt may go at +%v, before the bucket holds it (+13 s)", at.Sub(t0))
	}
	if at.After(t0.Add(15 * time.Second)) {
		t.Errorf("the next attempt waits until +%v: the window is read as fixed (full at +19 s), not as the bucket it is (949 tokens at +13 s)", at.Sub(t0))
	}
	// By +31 s the bucket lets 204 + 400 * 19.7 tokens start: 8 more.
	if _, tokens := s.Forecast(now, t0.Add(31*time.Second), 0); tokens < 6*cost || tokens > 9*cost {
		t.Errorf("forecast %d tokens (%d attempts) from +11.3 s to +31 s, want those of 6 to 8 attempts (a bucket at 300-400 a second)", tokens, tokens/cost)
	}
}

// A window's first statement, "3051 tokens left of 4,000, full again in
// 2.373s" (OpenAI's, to the millisecond), made at the admission of an
// attempt of 949 tokens sent on a whole second and read 141 ms later, puts
// its reset strictly between two whole seconds. A fixed window aligned to
// the clock (PROVIDERS.md: some compatible servers align theirs to clock
// minutes) is full again on a whole second; so this is a bucket's (OpenAI
// refills continuously), 949 tokens at 400 a second, and a forecast from
// +11.14 s to +31 s counts 4,000 and 400 a second: 12 attempts of 949,
// not a 2.373 s window's 4,000 every 2.4 s (the simulation's token-window
// told 18 requests their 429 at the burst's first answer, 145 ms late).
// "10s" (on a whole second) is still read as a fixed window's first
// request: 4,000 now and 4,000 at the next reset, 8 attempts; and so is
// "9.869s" sent at +131.337564 ms (a window aligned to +10 s: 9.868662 s
// rounded to the millisecond puts the send plus the countdown 0.3 ms past
// the whole second, which the rounding covers): 4,000 at each reset,
// every 9.9 s, 8 to 12 attempts, not a bucket's 6 (taken for one, it
// cost window-roll seed 18 a window of its burst).
func TestAFirstResetBetweenWholeSecondsIsForecastAsABucket(t *testing.T) {
	for _, tc := range []struct {
		name       string
		sent, read time.Duration
		reset      time.Duration
		min, max   int64 // attempts of 949
	}{
		{"2.373s", 0, 141 * time.Millisecond, 2373 * time.Millisecond, 12, 12},
		{"10s", 0, 141 * time.Millisecond, 10 * time.Second, 8, 8},
		{"9.869s", 131337564, 260 * time.Millisecond, 9869 * time.Millisecond, 8, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewState()
			a, _ := s.AcquireAttempt(t0.Add(tc.sent), 949)
			o := provider.NewObservation(provider.OK)
			o.Tokens = provider.Window{Limit: 4000, Remaining: 3051, Reset: tc.reset, Resolution: time.Millisecond}
			if tc.reset%time.Second == 0 {
				o.Tokens.Resolution = time.Second
			}
			s.ObserveAttempt(a, t0.Add(tc.read), o, DefaultPolicy)
			s.ReleaseAttempt(a)
			_, tokens := s.Forecast(t0.Add(11140*time.Millisecond), t0.Add(31*time.Second), 0)
			if n := tokens / 949; n < tc.min || n > tc.max {
				t.Errorf("forecast %d tokens, %d attempts of 949, want %d to %d", tokens, n, tc.min, tc.max)
			}
		})
	}
}
