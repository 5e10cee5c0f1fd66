package capacity

import (
	"context"
	"strconv"
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

func (f *fakeSpendStore) AddSpend(_ context.Context, key string, usd float64, _ SpendOp, _ time.Duration) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.totals[key] += usd
	return f.totals[key], nil
}

func (f *fakeSpendStore) HoldSpend(_ context.Context, key string, usd, limit float64, _ time.Duration) (bool, float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.totals[key]+usd > limit {
		return false, f.totals[key], nil
	}
	f.totals[key] += usd
	return true, f.totals[key], nil
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

// A hold takes its worst case out of the budget until it is settled: the
// budget is never promised twice; Settle spends what the attempt cost and
// gives back the rest in one step, and a hold given back (0 spent)
// returns all of it.
func TestSpendingHolds(t *testing.T) {
	s := NewSpending(SpendLimit{USD: 1, Period: time.Hour}, nil, "x")
	t0 := time.Date(2026, 11, 30, 10, 20, 0, 0, time.UTC)
	a, ok, _ := s.Hold(t0, 0.5)
	b, ok2, _ := s.Hold(t0, 0.5)
	if !ok || !ok2 {
		t.Fatal("two holds of 0.5 fit a budget of 1")
	}
	if _, ok, until := s.Hold(t0, 0.01); ok || !until.Equal(time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC)) {
		t.Errorf("a third hold: fits %v until %v, want no room until 11:00", ok, until)
	}
	if over, _ := s.Over(t0); over {
		t.Error("holds are not spending: the budget is not spent")
	}
	s.Settle(t0, a, 0.2)
	s.Settle(t0, b, 0)
	s.Settle(t0, b, 0) // settled once
	if r := s.Report(t0); r.SpentUSD != 0.2 || r.HeldUSD != 0 {
		t.Errorf("after settling 0.2 and giving back a hold: %+v", r)
	}
	if fits, _ := s.Fits(t0, 0.8); !fits {
		t.Error("0.8 fits what is left")
	}
	if fits, _ := s.Fits(t0, 0.81); fits {
		t.Error("0.81 does not")
	}
	// A hold of the last window settled in the next: its spend counts there.
	c, _, _ := s.Hold(t0, 0.5)
	s.Settle(t0.Add(time.Hour), c, 0.3)
	if r := s.Report(t0.Add(time.Hour)); r.SpentUSD != 0.3 || r.HeldUSD != 0 {
		t.Errorf("the next window: %+v", r)
	}
}

// In fleet mode a hold goes through the store's total, atomically: two
// instances cannot hold more than the budget between them; settling moves
// the total by the difference.
func TestSpendingHoldsAreShared(t *testing.T) {
	store := &fakeSpendStore{totals: map[string]float64{}}
	a, b := NewSpending(SpendLimit{USD: 0.01, Period: time.Hour}, store, "g"), NewSpending(SpendLimit{USD: 0.01, Period: time.Hour}, store, "g")
	t0 := time.Date(2026, 11, 30, 10, 20, 0, 0, time.UTC)
	ha, ok, _ := a.Hold(t0, 0.005)
	hb, ok2, _ := b.Hold(t0, 0.005)
	if !ok || !ok2 {
		t.Fatal("two holds of 0.005 fit 0.01 fleet-wide")
	}
	if _, ok, _ := a.Hold(t0, 0.005); ok {
		t.Error("a third hold fits nowhere in the fleet")
	}
	a.Settle(t0, ha, 0.002)
	b.Settle(t0, hb, 0.005)
	if v, _ := store.Spend(context.Background(), "g:"+strconv.FormatInt(t0.UnixNano()/int64(time.Hour), 10)); v < 0.007-1e-12 || v > 0.007+1e-12 {
		t.Errorf("the fleet's total: %v, want 0.007", v)
	}
	if _, ok, _ := a.Hold(t0, 0.003); !ok {
		t.Error("0.003 fits what the fleet has left")
	}
}

// unreachable is a fleet store that cannot be reached.
type unreachable struct{}

func (unreachable) AddSpend(context.Context, string, float64, SpendOp, time.Duration) (float64, error) {
	return 0, context.DeadlineExceeded
}

func (unreachable) HoldSpend(context.Context, string, float64, float64, time.Duration) (bool, float64, error) {
	return false, 0, context.DeadlineExceeded
}

func (unreachable) Spend(context.Context, string) (float64, error) {
	return 0, context.DeadlineExceeded
}

// With the store unreachable, an instance holds and spends on what it
// knows: the budget, less what it spent and holds itself.
func TestSpendingHoldsWithTheStoreDown(t *testing.T) {
	s := NewSpending(SpendLimit{USD: 0.01, Period: time.Hour}, unreachable{}, "g")
	t0 := time.Date(2026, 11, 30, 10, 20, 0, 0, time.UTC)
	h, ok, _ := s.Hold(t0, 0.006)
	if !ok {
		t.Fatal("a hold within the budget fits on what the instance knows")
	}
	if _, ok, _ := s.Hold(t0, 0.006); ok {
		t.Error("a second hold past the budget does not")
	}
	s.Settle(t0, h, 0.006)
	if r := s.Report(t0); r.SpentUSD != 0.006 || r.HeldUSD != 0 {
		t.Errorf("kept here: %+v", r)
	}
}
