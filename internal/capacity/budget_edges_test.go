package capacity

import (
	"math"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Tests of the provider-stated windows (budget.go), driven through the
// window itself with instants relative to t0: what it lets go and when.

// newWindowA is a window with nothing known, as NewState makes them.
func newWindowA() *window {
	return &window{limit: provider.Unknown, remaining: provider.Unknown, stated: provider.Unknown}
}

// winA is a stated window.
func winA(limit, remaining int64, reset time.Duration) provider.Window {
	return provider.Window{Limit: limit, Remaining: remaining, Reset: reset}
}

// atA is t0 plus d.
func atA(d time.Duration) time.Time { return t0.Add(d) }

const msA = time.Millisecond

// An answer to an attempt sent before the window rolled over speaks of the
// window before: it does not refill the new window the router just spent.
func TestAStaleAnswerDoesNotRefillTheNewWindow(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(1, 0, 10*time.Second), 0, 0)
	t1 := atA(11 * time.Second) // past the reset (10.05 s): the window is full
	w.spend(t1, 1)              // rolls it over and spends its one unit
	w.update(t1.Add(time.Second), atA(5*time.Second), winA(1, 1, 5*time.Second), 0, 0)
	// The window may have started with the attempt at +11 s: it is full
	// again a span after it at the earliest.
	if at := w.availableAt(t1.Add(time.Second), 1, 0); !at.Equal(t1.Add(10*time.Second + ResetMargin)) {
		t.Errorf("expected to wait for the next reset at +21.05 s, got %v", at.Sub(t0))
	}
}

// A stated reset of 0 is a reset (now, plus the margin), and a reset stated
// without a count still moves when the spent window is full again.
func TestAResetWithoutACountMovesTheWait(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(10, 0, 0), 0, 0)
	if at := w.availableAt(t0, 1, 0); !at.Equal(atA(ResetMargin)) {
		t.Errorf("reset 0: expected to wait the margin, got %v", at.Sub(t0))
	}
	for _, reset := range []time.Duration{0, 2 * time.Second} {
		w := newWindowA()
		w.update(t0, t0, winA(10, 0, 10*time.Second), 0, 0)
		now := atA(time.Second)
		w.update(now, now, winA(10, provider.Unknown, reset), 0, 0)
		if at := w.availableAt(now, 1, 0); !at.Equal(now.Add(reset + ResetMargin)) {
			t.Errorf("reset %v stated alone: expected to wait until +%v, got %v", reset, (time.Second + reset + ResetMargin), at.Sub(t0))
		}
	}
}

// An answer stating a reset a whole span later than the known one shows a
// fixed window that rolled over early: the count is the safe side, what it
// states less what is still in flight. A window whose span is unknown
// (resets stated as 0) is never taken for a new one: the router's own
// count stands within what the answer allows.
func TestAWindowThatRolledOverEarlyTakesTheSafeSide(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(10, 9, 10*time.Second), 0, 0)
	now := atA(6 * time.Second)
	w.update(now, now, winA(10, 5, 10*time.Second+100*msA), 2, 0) // reset at +16.15 s
	if at := w.availableAt(now, 4, 0); !at.Equal(atA(16*time.Second + 150*msA)) {
		t.Errorf("5 stated, 2 in flight: 4 should wait for the reset, got %v", at.Sub(t0))
	}
	if at := w.availableAt(now, 3, 0); !at.Equal(now) {
		t.Errorf("5 stated, 2 in flight: 3 should go now, got %v", at.Sub(t0))
	}

	u := newWindowA()
	u.update(t0, t0, winA(10, 5, 0), 0, 0) // span unknown (0)
	u.spend(atA(5*msA), 1)                 // 4 left by the router's count
	now = atA(10 * msA)
	u.update(now, now, winA(10, 5, 0), 2, 0)
	if at := u.availableAt(now, 4, 0); !at.Equal(now) {
		t.Errorf("4 left by the router's count: 4 should go now, got %v", at.Sub(t0))
	}
}

// A count that grows before the stated reset, by more than answers out of
// order explain, shows a bucket that refills continuously: what it lacks
// comes at the rate the statement implies ((limit - remaining) / reset).
func TestARefillingWindowIsDetectedAndPaced(t *testing.T) {
	refillAt := func(cur, need int64, rate float64) time.Duration {
		return time.Duration(math.Ceil(float64(need-cur) / rate * float64(time.Second)))
	}
	// From 0 to 3 with 8 s to go: 7 lacking over 8 s, 0.875 a second.
	w := newWindowA()
	w.update(t0, t0, winA(10, 0, 10*time.Second), 0, 0)
	now := atA(2 * time.Second)
	w.update(now, now, winA(10, 3, 8*time.Second), 0, 0)
	if at := w.availableAt(now, 5, 0); !at.Equal(now.Add(refillAt(3, 5, 0.875))) {
		t.Errorf("3 left refilling 0.875/s: expected 5 in %v, got %v", refillAt(3, 5, 0.875), at.Sub(now))
	}
	// It never holds more than its limit: 3 + 8.75 at +12 s is 10.
	if got := w.forecast(atA(12*time.Second), atA(12*time.Second), 0, false); got != 10 {
		t.Errorf("a bucket of 10 held %d", got)
	}

	// The same count again, or a rise that attempts in flight explain, is
	// a fixed window: what it lacks comes at the reset.
	for _, c := range []struct {
		remaining, since int64
	}{{3, 0}, {4, 2}} {
		w := newWindowA()
		w.update(t0, t0, winA(10, 3, 10*time.Second), 0, 0)
		w.update(now, now, winA(10, c.remaining, 8*time.Second), c.since, 0)
		if at := w.availableAt(now, 5, 0); !at.Equal(atA(10*time.Second + ResetMargin)) {
			t.Errorf("%d stated, %d in flight: expected 5 at the reset (+10.05 s), got %v", c.remaining, c.since, at.Sub(t0))
		}
	}

	// A rise with a reset of 0 proves nothing: a later statement past the
	// known reset is a fixed window's next one.
	w = newWindowA()
	w.update(t0, t0, winA(10, 3, 10*time.Second), 0, 0)
	w.update(now, now, winA(10, 5, 0), 0, 0)
	now = atA(3 * time.Second)
	w.update(now, now, winA(10, 6, 5*time.Second), 0, 0)
	if at := w.availableAt(now, 8, 0); !at.Equal(atA(8*time.Second + ResetMargin)) {
		t.Errorf("a fixed window: expected 8 at the reset (+8.05 s), got %v", at.Sub(t0))
	}
}

// A bucket keeps the rate it proved when an answer implies none: a reset
// of 0 (no time to refill in) or a full count (nothing lacking).
func TestABucketKeepsItsRate(t *testing.T) {
	bucket := func() *window { // 3 left at +2 s, refilling 0.875/s
		w := newWindowA()
		w.update(t0, t0, winA(10, 0, 10*time.Second), 0, 0)
		w.update(atA(2*time.Second), atA(2*time.Second), winA(10, 3, 8*time.Second), 0, 0)
		return w
	}
	now := atA(3 * time.Second)
	w := bucket()
	w.update(now, now, winA(10, 4, 0), 0, 0)
	want := now.Add(time.Duration(math.Ceil(2 / 0.875 * float64(time.Second))))
	if at := w.availableAt(now, 6, 0); !at.Equal(want) {
		t.Errorf("reset 0 stated: expected 6 in %v, got %v", want.Sub(now), at.Sub(now))
	}

	w = bucket()
	w.update(now, now, winA(10, 10, time.Second), 0, 0)
	w.spend(now, 10)
	want = now.Add(time.Duration(math.Ceil(1 / 0.875 * float64(time.Second))))
	if at := w.availableAt(now, 1, 0); !at.Equal(want) {
		t.Errorf("stated full, then spent: expected 1 in %v, got %v", want.Sub(now), at.Sub(now))
	}

	// An attempt sent on an empty bucket uses what had partly refilled:
	// the next unit is a whole unit's time after it.
	w = bucket()
	w.spend(atA(2*time.Second), 3)
	w.spend(atA(2500*msA), 1) // 0.44 refilled, spent
	if at := w.availableAt(atA(3200*msA), 1, 0); !at.After(atA(3200 * msA)) {
		t.Errorf("expected to wait for a whole unit after the send at +2.5 s, got %v", at.Sub(t0))
	}
}

// A rise seen before the reset with the count at the limit proves a
// bucket but no rate: the window waits for its stated reset, not forever.
func TestABucketWithoutARateWaitsForItsReset(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(10, 3, 10*time.Second), 0, 0)
	now := atA(2 * time.Second)
	w.update(now, now, winA(10, 10, 8*time.Second), 0, 0)
	w.spend(now, 10)
	if at := w.availableAt(now, 1, 0); !at.Equal(atA(10*time.Second + ResetMargin)) {
		t.Errorf("expected to wait for the reset at +10.05 s, got %v", at.Sub(t0))
	}
}

// What a token window counts per estimated unit is learned from an
// answer's drop, even a drop of nothing (floored at minRatio); an answer
// from the provider's next window teaches nothing; samples are weighted.
func TestAWindowsRatio(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(1000, 1000, 10*time.Second), 0, 0)
	w.update(atA(time.Second), t0, winA(1000, 1000, 9*time.Second), 0, 100)
	if got := w.forecastUnits(atA(time.Second), atA(time.Second), 0, false); got != 1000/minRatio {
		t.Errorf("nothing counted: expected 1000 at the floor ratio (100000 units), got %d", got)
	}

	w = newWindowA()
	w.update(t0, t0, winA(1000, 1000, 10*time.Second), 0, 0)
	if got := w.forecastUnits(t0, t0, 0, false); got != 1000 || w.ratio != 0 {
		t.Errorf("no ratio learned: expected the window's 1000 (a ratio of 1, the estimate is what is admitted on), got %d (ratio %v)", got, w.ratio)
	}
	now := atA(6 * time.Second)
	w.update(now, now, winA(1000, 900, 10*time.Second+100*msA), 0, 100) // the next window
	if got := w.forecastUnits(now, now, 0, false); got != 900 || w.ratio != 0 {
		t.Errorf("an answer from the next window: expected no ratio learned (900 at 1), got %d (ratio %v)", got, w.ratio)
	}

	w = newWindowA()
	w.update(t0, t0, winA(1000, 1000, 10*time.Second), 0, 0)
	w.update(atA(time.Second), atA(time.Second), winA(1000, 950, 9*time.Second), 0, 100) // 0.5
	w.update(atA(2*time.Second), atA(2*time.Second), winA(1000, 850, 8*time.Second), 0, 100)
	// 0.5 + 0.3 * (1 - 0.5) = 0.65: 850 left, 1307 estimated.
	if got := w.forecastUnits(atA(2*time.Second), atA(2*time.Second), 0, false); got != 1307 {
		t.Errorf("ratio 0.65: expected 1307 units, got %d", got)
	}
	// An attempt estimated at nothing spends nothing.
	w.spend(atA(2*time.Second), 0)
	if got := w.forecast(atA(2*time.Second), atA(2*time.Second), 0, false); got != 850 {
		t.Errorf("an attempt of 0 spent: expected 850 left, got %d", got)
	}

	// An empty window forecasts none, not unknown (which bounds nothing).
	w = newWindowA()
	w.update(t0, t0, winA(1000, 1000, 10*time.Second), 0, 0)
	w.update(atA(time.Second), atA(time.Second), winA(1000, 0, 9*time.Second), 0, 1000)
	if got := w.forecastUnits(atA(time.Second), atA(time.Second), 0, false); got != 0 {
		t.Errorf("an empty window: expected 0 units, got %d", got)
	}
}

// After a fixed window rolls over the router knows it was full: the first
// answer in the new window teaches the ratio from the limit.
func TestTheRatioIsLearnedAfterARoll(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(1000, 0, 10*time.Second), 0, 0)
	sent := atA(10*time.Second + 100*msA)
	w.spend(sent, 100) // rolls over: 900 left
	now := atA(11 * time.Second)
	w.update(now, sent, winA(1000, 950, 9*time.Second+100*msA), 0, 100) // counted 50 of 100
	if got := w.forecastUnits(now, now, 0, false); got != 1900 {
		t.Errorf("950 left at 0.5 per unit: expected 1900 units, got %d", got)
	}
}

// Answers that are no known attempt's (State.Observe) say nothing of what
// an attempt counts: the token window's ratio stays unlearned.
func TestObserveTeachesNoRatio(t *testing.T) {
	tok := func(remaining int64, reset time.Duration) provider.Observation {
		o := provider.NewObservation(provider.OK)
		o.Tokens = winA(1000, remaining, reset)
		return o
	}
	s := NewState()
	s.Observe(t0, tok(1000, 10*time.Second), DefaultPolicy)
	s.Observe(atA(time.Second), tok(900, 9*time.Second), DefaultPolicy)
	if _, tk := s.Forecast(atA(time.Second), atA(2*time.Second), 0); tk != 900 || s.tokens.ratio != 0 {
		t.Errorf("expected the ratio unlearned and the tokens forecast at 1 (900), got %d (ratio %v)", tk, s.tokens.ratio)
	}
}

// What is spent within the margin before a fixed window's reset counts
// against the next window too.
func TestSpendingJustBeforeAResetCountsAgainstTheNext(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(10, 5, 10*time.Second), 0, 0) // reset at +10.05 s
	w.spend(atA(10*time.Second+10*msA), 2)
	if got := w.forecast(atA(10*time.Second+10*msA), atA(10*time.Second+500*msA), 0, false); got != 11 {
		t.Errorf("3 left, then 10 less the 2 carried: expected 11, got %d", got)
	}
	if got := w.forecast(atA(10*time.Second+100*msA), atA(10*time.Second+100*msA), 0, false); got != 8 {
		t.Errorf("after the reset: expected 10 less the 2 carried, got %d", got)
	}
}

// When a fixed window's next reset is: unknown once the stated one passed
// with no span known (the limit still bounds what goes until an answer
// states the window, or nothing is in flight to); a span after the
// request that starts it after an idle span; the span the statements
// bound, kept across windows without a statement.
func TestNextReset(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(2, 0, 0), 0, 0) // span unknown
	w.spend(atA(60*msA), 1)
	if at := w.availableAt(atA(60*msA), 1, 0); !at.Equal(atA(60 * msA)) {
		t.Errorf("span unknown, 1 of 2 spent: expected the second to go, got %v", at.Sub(t0))
	}
	w.spend(atA(60*msA), 1)
	if at := w.availableAt(atA(60*msA), 1, 0); !at.Equal(atA(60*msA + holdWait)) {
		t.Errorf("span unknown, the limit spent: expected to hold for an answer, got %v", at.Sub(t0))
	}
	w.unhold()
	if at := w.availableAt(atA(60*msA), 1, 0); !at.Equal(atA(60 * msA)) {
		t.Errorf("span unknown, nothing in flight: expected nothing held back, got %v", at.Sub(t0))
	}

	w = newWindowA()
	w.update(t0, t0, winA(10, 0, 10*time.Second), 0, 0) // reset at +10.05 s
	now := atA(20*time.Second + ResetMargin)            // a whole span after it
	w.spend(now, 10)
	if at := w.availableAt(now, 1, 0); !at.Equal(now.Add(10*time.Second + ResetMargin)) {
		t.Errorf("after an idle span: expected the next reset a span after now, got %v", at.Sub(now))
	}

	w = newWindowA()
	w.update(t0, t0, winA(10, 0, 10*time.Second), 0, 0)
	w.spend(atA(10*time.Second+ResetMargin), 10) // roll: next reset +20.1 s
	w.update(atA(11*time.Second), atA(10*time.Second+ResetMargin), winA(10, 0, 4*time.Second), 0, 0)
	w.spend(atA(15*time.Second+ResetMargin), 10) // roll: span 4 s stated, but no window is longer than 5.05 s
	// (the second statement's reset is at the latest at +15.05 s, the
	// first one's at the earliest at +10 s): projected with that bound.
	period := 5*time.Second + ResetMargin
	t3 := atA(15*time.Second + ResetMargin).Add(period + ResetMargin)
	w.spend(t3, 10) // roll without a statement since
	if at := w.availableAt(t3, 1, 0); !at.Equal(t3.Add(period + ResetMargin)) {
		t.Errorf("expected the next reset %v later, got %v", period+ResetMargin, at.Sub(t3))
	}
	t4 := t3.Add(period + ResetMargin)
	w.spend(t4, 10)
	if at := w.availableAt(t4, 1, 0); !at.Equal(t4.Add(period + ResetMargin)) {
		t.Errorf("span kept: expected the next reset %v later, got %v", period+ResetMargin, at.Sub(t4))
	}
}

// An attempt larger than the window's limit goes on a full window.
func TestALargeAttemptGoesOnAFullWindow(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(100, 100, 10*time.Second), 0, 0)
	if at := w.availableAt(t0, 500, 0); !at.Equal(t0) {
		t.Errorf("expected 500 to go on a full window of 100, got %v", at.Sub(t0))
	}
}

// A spent window forecasts none; a window too large to count forecasts
// the cap, MaxInt64/4, and no forecast exceeds it (callers add a few).
func TestForecastBounds(t *testing.T) {
	w := newWindowA()
	w.update(t0, t0, winA(10, 0, 10*time.Second), 0, 0)
	if got := w.forecast(t0, atA(time.Second), 0, false); got != 0 {
		t.Errorf("spent window: expected 0, got %d", got)
	}
	const capA = math.MaxInt64 / 4
	w = newWindowA()
	w.update(t0, t0, winA(1<<62, 0, 10*time.Second), 0, 0)
	if got := w.forecast(t0, atA(40*time.Second+300*msA), 0, false); got != capA { // 4 resets
		t.Errorf("4 resets of 2^62: expected the cap, got %d", got)
	}
	w = newWindowA()
	w.update(t0, t0, winA(capA, capA, 10*time.Second), 0, 0)
	if got := w.forecast(t0, atA(10*time.Second+ResetMargin), 0, false); got != capA {
		t.Errorf("full, then full again: expected the cap, got %d", got)
	}
	w.share = 1 // fleet mode, all of it this instance's
	if got := w.forecast(t0, atA(10*time.Second+ResetMargin), 0, false); got != capA {
		t.Errorf("a share of 1: expected the cap, got %d", got)
	}
}
