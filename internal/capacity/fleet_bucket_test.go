package capacity

import (
	"errors"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// bucketState is a State whose request window proved a bucket of 100
// refilled at 10 a second (0 left, full in 10 s; 30 left, full in 7 s,
// 3 s later), bound to f, whose first answer (at +3 s) is the fleet's
// bucket, empty, spent lately by two instances.
func bucketState(t *testing.T, f *fakeFleet) (*State, time.Time) {
	t.Helper()
	s := NewState()
	ok := provider.NewObservation(provider.OK)
	ok.Requests = provider.Window{Limit: 100, Remaining: 0, Reset: 10 * time.Second}
	s.Observe(t0, ok, DefaultPolicy)
	now := t0.Add(3 * time.Second)
	ok.Requests = provider.Window{Limit: 100, Remaining: 30, Reset: 7 * time.Second}
	s.Observe(now, ok, DefaultPolicy)
	s.SetFleet(f)
	f.left = Budget{Requests: BudgetWindow{Limit: 100, Remaining: 0, Reset: now.Add(6 * time.Second), Span: 10 * time.Second, Rate: 10},
		Tokens: BudgetWindow{Limit: provider.Unknown}, Instances: 2}
	if !s.Acquire(now, 0) {
		t.Fatal("expected the first attempt to go")
	}
	s.Release()
	if len(f.spends) != 1 || f.spends[0].Requests.Rate != 10 || f.spends[0].Requests.Limit != 100 {
		t.Fatalf("expected the bucket asked of the fleet (limit 100, 10 a second), got %+v", f.spends)
	}
	return s, now
}

// With Redis down (Spend's error, the instance holding no slice), a
// bucket the fleet shared among two instances refills here at half its
// rate, an equal share, not at the whole rate, which each cut-off
// instance would spend; once the fleet answers again, its count stands
// and the whole rate with it.
func TestBucketRefillsAtItsShareWhileTheFleetCannotAnswer(t *testing.T) {
	f := &fakeFleet{}
	s, now := bucketState(t, f)
	f.err = errors.New("redis down")
	later := now.Add(2 * time.Second)
	served := 0
	for range 40 {
		if s.Acquire(later, 0) {
			served++
			s.Release()
		}
	}
	if served != 10 {
		t.Errorf("expected 2 s at half of 10 a second (10) from the bucket while the fleet cannot answer, got %d", served)
	}
	f.err = nil
	f.left.Requests.Remaining = 20
	later = later.Add(time.Second)
	if !s.Acquire(later, 0) {
		t.Fatal("expected the fleet's answer to be taken")
	}
	s.Release()
	if got := s.requests.current(later.Add(time.Second)); got != 30 {
		t.Errorf("expected the fleet's count (20) refilled at the whole rate a second later (30), got %d", got)
	}
}

// What a bucket the fleet shares lets this instance start (Forecast, for a
// place counted in this instance's queue alone: the fleet's queue cannot
// tell) is its share of it, an equal one among the instances that spent
// it lately, not the whole bucket, which every instance would count as
// its own; for a place counted fleet-wide (ForecastFleet) it is the
// whole. Before, both were the whole (50 in 5 s from an empty bucket of
// 10 a second).
func TestAFleetBucketsLocalForecastIsItsShare(t *testing.T) {
	f := &fakeFleet{}
	s, now := bucketState(t, f)
	until := now.Add(5 * time.Second)
	whole, _ := s.ForecastFleet(now, until, 0)
	local, _ := s.Forecast(now, until, 0)
	t.Logf("forecast for 5 s: %d fleet-wide, %d here", whole, local)
	if whole < 45 || whole > 50 {
		t.Errorf("expected the fleet's bucket to serve its refill in 5 s (about 50), got %d", whole)
	}
	if local < whole/2-1 || local > whole/2+1 {
		t.Errorf("expected this instance's forecast to be half of the fleet's %d (two instances), got %d", whole, local)
	}
}

// A fixed window that renews while the fleet cannot answer (Redis down,
// the instance holding no slice of the new window) is this instance's
// equal share of the limit among the instances that spent it lately, not
// the whole limit, which each cut-off instance would spend at once (a
// Redis killed mid-burst drew 7-18 upstream 429s when the window renewed
// during the outage, trial38); once the fleet answers again, its count
// stands.
func TestAFixedWindowRenewedWhileTheFleetCannotAnswerIsAShare(t *testing.T) {
	s := NewState()
	ok := provider.NewObservation(provider.OK)
	ok.Requests = provider.Window{Limit: 100, Remaining: 99, Reset: 10 * time.Second}
	s.Observe(t0, ok, DefaultPolicy)
	f := &fakeFleet{}
	s.SetFleet(f)
	now := t0.Add(time.Second)
	f.left = Budget{Requests: BudgetWindow{Limit: 100, Remaining: 40, Reset: t0.Add(10 * time.Second), Span: 10 * time.Second},
		Tokens: BudgetWindow{Limit: provider.Unknown}, Instances: 2}
	if !s.Acquire(now, 0) {
		t.Fatal("expected the first attempt to go")
	}
	s.Release()
	f.err = errors.New("redis down")
	later := t0.Add(12 * time.Second) // the window renewed at 10 s
	served := 0
	for range 100 {
		if s.Acquire(later, 0) {
			served++
			s.Release()
		}
	}
	if served != 50 {
		t.Errorf("expected half of the renewed window (50) while the fleet cannot answer, got %d", served)
	}
	// Once the fleet answers again, the next renewal is the whole limit
	// (the fleet's budget decides it).
	f.err = nil
	f.left.Requests = BudgetWindow{Limit: 100, Remaining: 60, Reset: t0.Add(32 * time.Second), Span: 10 * time.Second}
	if !s.Acquire(t0.Add(23*time.Second), 0) {
		t.Fatal("expected an attempt in the next window")
	}
	s.Release()
	if got := s.requests.current(t0.Add(33 * time.Second)); got != 100 {
		t.Errorf("expected the window after the fleet answered renewed whole (100), got %d", got)
	}
}
