package capacity

import (
	"context"
	"sync"
	"testing"
	"time"
)

// A budget's window: spending adds up within it, the budget is spent
// once it reaches the limit, until the window ends (a multiple of the
// period since the epoch), and a new window starts from nothing.
func TestSpendingWindows(t *testing.T) {
	s := NewSpending(SpendLimit{USD: 1, Period: time.Hour}, nil, "x")
	t0 := time.Date(2026, 11, 30, 10, 20, 0, 0, time.UTC)
	if over, _ := s.Add(t0, 0.6); over {
		t.Fatal("0.6 of 1: not spent")
	}
	over, until := s.Add(t0.Add(time.Minute), 0.4)
	if !over || !until.Equal(time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC)) {
		t.Errorf("1 of 1: over %v until %v, want spent until 11:00", over, until)
	}
	if over, _ := s.Over(t0.Add(39 * time.Minute)); !over {
		t.Error("still spent before the window ends")
	}
	if over, _ := s.Over(t0.Add(40 * time.Minute)); over {
		t.Error("a new window starts from nothing")
	}
	r := s.Report(t0.Add(41 * time.Minute))
	if r.BudgetUSD != 1 || r.PeriodSeconds != 3600 || r.SpentUSD != 0 || !r.ResetsAt.Equal(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)) {
		t.Errorf("report %+v", r)
	}
	var none *Spending
	if over, _ := none.Add(t0, 5); over || none.Report(t0) != nil {
		t.Error("no budget: never spent")
	}
}

// fakeSpendStore is a fleet's shared totals.
type fakeSpendStore struct {
	mu     sync.Mutex
	totals map[string]float64
}

func (f *fakeSpendStore) AddSpend(_ context.Context, key string, usd float64, _ time.Duration) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.totals[key] += usd
	return f.totals[key], nil
}

func (f *fakeSpendStore) Spend(_ context.Context, key string) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.totals[key], nil
}

// In fleet mode the instances spend one budget: what one spends, the
// other sees (at its next look, within spendLookEvery).
func TestSpendingIsShared(t *testing.T) {
	store := &fakeSpendStore{totals: map[string]float64{}}
	a, b := NewSpending(SpendLimit{USD: 1, Period: time.Hour}, store, "g"), NewSpending(SpendLimit{USD: 1, Period: time.Hour}, store, "g")
	t0 := time.Date(2026, 11, 30, 10, 20, 0, 0, time.UTC)
	a.Add(t0, 0.7)
	if over, _ := b.Add(t0, 0.2); over {
		t.Error("0.9 of 1 fleet-wide: not spent")
	}
	a.Add(t0, 0.2)
	if over, _ := b.Over(t0.Add(spendLookEvery)); !over {
		t.Errorf("1.1 of 1 fleet-wide: b sees it spent (b's report %+v)", b.Report(t0))
	}
}

// A spend stamped in a window already past (it landed after the boundary,
// or the clock stepped back) counts in the current window, never rolls it
// back to zero.
func TestSpendingNeverRollsBack(t *testing.T) {
	s := NewSpending(SpendLimit{USD: 5, Period: time.Hour}, nil, "x")
	t13 := time.Date(2026, 11, 30, 13, 0, 1, 0, time.UTC)
	s.Add(t13, 4)
	s.Add(t13.Add(-2*time.Second), 0.5)
	if r := s.Report(t13.Add(time.Second)); r.SpentUSD != 4.5 {
		t.Errorf("spent %v, want 4.5", r.SpentUSD)
	}
}

// failingReads is a fleet store whose reads fail: what Add's own answer
// says of the fleet's total is what the instance knows.
type failingReads struct{ fakeSpendStore }

func (*failingReads) Spend(context.Context, string) (float64, error) {
	return 0, context.DeadlineExceeded
}

// Add learns the fleet's total from its own answer: the spend that
// crosses the budget fleet-wide says so at once, even when reads fail.
func TestSpendingAddKnowsTheFleetsTotal(t *testing.T) {
	store := &failingReads{fakeSpendStore{totals: map[string]float64{}}}
	a, b := NewSpending(SpendLimit{USD: 1, Period: time.Hour}, store, "g"), NewSpending(SpendLimit{USD: 1, Period: time.Hour}, store, "g")
	t0 := time.Date(2026, 11, 30, 10, 20, 0, 0, time.UTC)
	a.Add(t0, 0.7)
	if over, _ := b.Add(t0, 0.4); !over {
		t.Errorf("1.1 of 1 fleet-wide: b's Add says spent (b's report %+v)", b.Report(t0))
	}
	if r := b.Report(t0); r.SpentUSD < 1.1-1e-9 {
		t.Errorf("b knows %v of the fleet's 1.1", r.SpentUSD)
	}
}
