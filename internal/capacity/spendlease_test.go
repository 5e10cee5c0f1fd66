package capacity

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeLeaser is a fleet's shared totals that lease slices as fleet mode's
// leaseSpendScript does (internal/fleet/spend.go), in float64 as Redis'
// Lua computes: need and, up to ask, half of what limit leaves beyond
// need and keep; it keeps each writer's slice as stated (with no expiry)
// and answers the others'.
type fakeLeaser struct {
	fakeSpendStore
	calls  int
	slices map[string]float64 // writer -> slice as it last stated it
}

func (f *fakeLeaser) LeaseSpend(_ context.Context, l SpendLease) (SpendGrant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.slices == nil {
		f.slices = map[string]float64{}
	}
	others := 0.0
	for w, v := range f.slices {
		if w != l.Writer {
			others += v
		}
	}
	total := f.totals[l.Key]
	room := l.Limit - total
	g := 0.0
	if room > 0 && l.Need <= room {
		g = max(l.Need+max(min(l.Ask-l.Need, (room-l.Need-l.Keep)/2), 0), 0)
	}
	f.slices[l.Writer] = l.Held + g
	if g <= 0 {
		return SpendGrant{Total: total, Others: others}, nil
	}
	g, _ = strconv.ParseFloat(strconv.FormatFloat(g, 'g', 17, 64), 64)
	f.totals[l.Key], _ = strconv.ParseFloat(strconv.FormatFloat(total+g, 'f', 17, 64), 64) // INCRBYFLOAT's reply: %.17Lf
	return SpendGrant{Granted: g, Total: f.totals[l.Key], Others: others}, nil
}

// settled waits until s has no renewal under way.
func settled(t *testing.T, s *Spending) {
	t.Helper()
	for range 500 {
		s.mu.Lock()
		busy := s.leasing
		s.mu.Unlock()
		if !busy {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("a renewal never landed")
}

// Two instances lease a budget of $0.01 that holds two attempts of
// $0.005: the first instance's slice and a renewal leave it a few 1e-12
// USD (the script's margin for rounding), and its second attempt leases
// what that lacks. A slice granted for an attempt's need holds the
// attempt, whatever the float sum of the two gives (it came to
// 0.004999999999999999 < 0.005, refusing the attempt and stranding the
// budget's second half on an instance that could not use it: 1 attempt
// served of 2).
func TestLeasedSliceForANeedHoldsIt(t *testing.T) {
	store := &fakeLeaser{fakeSpendStore: fakeSpendStore{totals: map[string]float64{}}}
	limit := SpendLimit{USD: 0.01, Period: time.Hour}
	a, b := NewSpending(limit, store, "budget:g"), NewSpending(limit, store, "budget:g")
	now := time.Unix(1700000000, 0)
	if _, ok, _ := a.Hold(now, 0.005); !ok {
		t.Fatal("expected the first attempt held")
	}
	settled(t, a)
	_, ok, _ := a.Hold(now, 0.005)
	_, okB, _ := b.Hold(now, 0.005)
	settled(t, a)
	total := store.totals[a.storeKey(a.index(now))]
	if !ok || okB {
		t.Errorf("expected the second attempt held by a and b refused (the budget holds 2), got a %v b %v (total %.17g, a's slice %g)", ok, okB, total, a.lease)
	}
	if math.Abs(total-0.01) > 1e-9 {
		t.Errorf("expected the fleet's total $0.01, got %.17g", total)
	}
}

// Two instances hold the last of a budget of $0.01 in fractions neither
// can use: a holds $0.005 of its slice unspent, b $0.002 (each attempt
// cost less than it held), and nothing is unleased. a's attempt of $0.006
// is refused; its slice, which cannot hold the attempt, goes back to the
// budget then, so that b's attempt of $0.006 fits what b holds and what a
// gave back (both were refused, each waiting for the other's fraction,
// with $0.007 of the budget unspent).
func TestARefusedSliceGoesBackForAnother(t *testing.T) {
	store := &fakeLeaser{fakeSpendStore: fakeSpendStore{totals: map[string]float64{}}}
	limit := SpendLimit{USD: 0.01, Period: time.Hour}
	a, b := NewSpending(limit, store, "budget:g"), NewSpending(limit, store, "budget:g")
	now := time.Unix(1700000000, 0)
	ha, ok, _ := a.Hold(now, 0.006)
	if !ok {
		t.Fatal("expected a's first attempt held")
	}
	settled(t, a)
	a.Settle(now, ha, 0.001)
	hb, ok, _ := b.Hold(now, 0.004)
	if !ok {
		t.Fatal("expected b's first attempt held")
	}
	settled(t, b)
	b.Settle(now, hb, 0.002)
	if _, ok, _ := a.Hold(now, 0.006); ok {
		t.Fatalf("expected a's $0.006 refused (a holds %g, b %g)", a.lease, b.lease)
	}
	settled(t, a)
	if _, ok, _ := b.Hold(now, 0.006); !ok {
		t.Errorf("expected b's $0.006 held from its slice and what a could not use (a holds %g, b %g, total %g)", a.lease, b.lease, store.totals[a.storeKey(a.index(now))])
	}
}

// fakeCarrier is a fakeLeaser that carries a window's total into another
// as fleet mode's carryScript does: what from's total has beyond what
// was carried from it before.
type fakeCarrier struct {
	fakeLeaser
	carried map[string]float64       // from -> its total last carried
	periods map[string]time.Duration // base -> the periods recorded (no expiry)
}

func newFakeCarrier() *fakeCarrier {
	return &fakeCarrier{fakeLeaser: fakeLeaser{fakeSpendStore: fakeSpendStore{totals: map[string]float64{}}}, carried: map[string]float64{}}
}

// heldPerDay holds $9.5 at 10:00 UTC of a consumer's budget under day on
// store, once its renewal landed, and returns the spending, the instant
// and the hold.
func heldPerDay(t *testing.T, store SpendStore, day SpendLimit) (*Spending, time.Time, *Hold) {
	t.Helper()
	s := NewSpendingByPeriod(day, store, "consumer:alice")
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	h, ok, _ := s.Hold(at, 9.5)
	if !ok {
		t.Fatalf("$9.5 of $%g: refused", day.USD)
	}
	settled(t, s)
	return s, at, h
}

func (f *fakeCarrier) SpendPeriods(_ context.Context, base string, per, _ time.Duration) ([]PeriodInUse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.periods == nil {
		f.periods = map[string]time.Duration{}
	}
	var out []PeriodInUse
	for k, d := range f.periods {
		if strings.HasPrefix(k, base+"|") && d != per {
			out = append(out, PeriodInUse{Period: d, Age: -1})
		}
	}
	f.periods[base+"|"+per.String()] = per
	return out, nil
}

func (f *fakeCarrier) CarrySpend(_ context.Context, from, key string, _ time.Duration) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o := f.totals[from]; o > f.carried[from] {
		f.totals[key] += o - f.carried[from]
		f.carried[from] = o
	}
	return f.totals[key], nil
}

// A slice renewed in the background for a window of the old period
// (its hold taken before a reload changed the budget's period, its
// lease call answered after) is leased from that window, whose total
// the new period's window carries: with the new period's key for the
// old window's index it was leased from a window no one spends in
// (empty: granted in full) and then given back to the new one, which
// lost what it gave back ($8.25 counted of $9.5 spent, and $0.6 held
// past the budget, in fleet's TestAFleetBudgetPeriodChangeKeepsTheSpend,
// 1 run in 20).
func TestASliceRenewedAcrossAReloadIsOfItsWindow(t *testing.T) {
	store := newFakeCarrier()
	day, half := SpendLimit{USD: 10, Period: 24 * time.Hour}, SpendLimit{USD: 10, Period: 12 * time.Hour}
	s, at, h := heldPerDay(t, store, day)
	old := s.index(at)
	s.SetLimit(half) // the reload lands while a renewal of the old window is under way
	s.mu.Lock()
	s.leasing = true
	s.mu.Unlock()
	s.renew(at, old)
	s.Settle(at.Add(time.Minute), h, 9.5)
	if r := s.Report(at.Add(time.Minute)); r == nil || math.Abs(r.SpentUSD-9.5) > 1e-6 {
		t.Errorf("expected $9.5 spent in the new period's window, got %+v (totals %v)", r, store.totals)
	}
	if _, ok, _ := s.Hold(at.Add(2*time.Minute), 0.6); ok {
		t.Errorf("$0.6 held with $9.5 of $10 spent (totals %v)", store.totals)
	}
	for k := range store.totals {
		if k != s.storeKeyOf(24*time.Hour, old) && k != s.storeKeyOf(12*time.Hour, s.index(at)) {
			t.Errorf("a write to %s, a window neither period's budget spends in", k)
		}
	}
}

// gatedCarrier is a fakeCarrier whose next lease call, once armed, waits
// for the gate (a call in flight).
type gatedCarrier struct {
	*fakeCarrier
	armed   chan struct{} // closed by the armed call on entering
	gate    chan struct{}
	pending bool
}

func (g *gatedCarrier) LeaseSpend(ctx context.Context, l SpendLease) (SpendGrant, error) {
	g.mu.Lock()
	wait := g.pending
	g.pending = false
	g.mu.Unlock()
	if wait {
		close(g.armed)
		<-g.gate
	}
	return g.fakeCarrier.LeaseSpend(ctx, l)
}

// A renewal in flight when a reload changes the period lands in the old
// window, before the carry (which waits for it), and what it granted
// goes back to the new window, as the slice held at the reload does:
// the new window counts what was spent ($9.5), not the grant too.
// Before, the grant was dropped (the window had rolled) and counted as
// spent in the new window by the carry.
func TestAGrantInFlightAcrossAReloadGoesBack(t *testing.T) {
	fc := newFakeCarrier()
	store := &gatedCarrier{fakeCarrier: fc, armed: make(chan struct{}), gate: make(chan struct{})}
	day, half := SpendLimit{USD: 20, Period: 24 * time.Hour}, SpendLimit{USD: 20, Period: 12 * time.Hour}
	s, at, h := heldPerDay(t, store, day)
	s.Settle(at, h, 9.5)
	s.GiveBack(at)
	store.mu.Lock()
	store.pending = true
	store.mu.Unlock()
	s.mu.Lock()
	s.leasing = true
	s.mu.Unlock()
	renewed := make(chan struct{})
	go func() { s.renew(at, s.index(at)); close(renewed) }()
	<-store.armed // the renewal's call is in flight
	s.SetLimit(half)
	held := make(chan bool)
	go func() {
		h, ok, _ := s.Hold(at.Add(time.Minute), 0.5)
		if ok {
			s.Settle(at.Add(time.Minute), h, 0)
		}
		held <- ok
	}()
	time.Sleep(20 * time.Millisecond) // the hold's carry waits for the call
	close(store.gate)
	<-renewed
	if !<-held {
		t.Fatal("$0.5 with $9.5 of $20 spent: refused")
	}
	s.GiveBack(at.Add(time.Minute))
	if r := s.Report(at.Add(time.Minute)); r == nil || math.Abs(r.SpentUSD-9.5) > 1e-6 {
		t.Errorf("expected $9.5 counted in the new period's window, got %+v (totals %v)", r, fc.totals)
	}
}
