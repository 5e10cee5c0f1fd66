package capacity

import (
	"context"
	"errors"
	"time"
)

// errWindowGone is a lease call's for a window this instance no longer
// counts: it is not sent.
var errWindowGone = errors.New("spend: the window rolled before the lease call")

// SpendLeaser is a SpendStore that leases slices of a budget (fleet mode's
// Redis): a Spending whose store is one holds and settles its attempts
// locally, against its slice, and calls the store only when the slice runs
// low or holds more than its demand (see Spending).
type SpendLeaser interface {
	// LeaseSpend adds a slice to l.Key's total (which expires after
	// l.TTL) and returns it, with the new total: l.Need and, up to l.Ask
	// (USD), half of what l.Limit leaves beyond l.Need and l.Keep (the
	// rest of the fleet leases the other half, and an attempt of l.Keep
	// fits elsewhere). A budget without room for l.Need grants 0 and
	// returns its total. It records l.Writer's slice (l.Held and the
	// grant) for l.EntryTTL, and returns what the other writers' slices
	// held as they last recorded them (Others).
	LeaseSpend(ctx context.Context, l SpendLease) (SpendGrant, error)
}

// SpendLease is a call to SpendLeaser.LeaseSpend (amounts in USD).
type SpendLease struct {
	Key                    string
	Need, Ask, Keep, Limit float64
	TTL                    time.Duration
	// Writer names the Spending (its SpendOps' Writer); Held is its
	// slice unspent before the grant, recorded with it for EntryTTL.
	Writer   string
	Held     float64
	EntryTTL time.Duration
	// InFlight is what its holds in flight hold (USD), recorded apart
	// for EntryTTL: they settle at their answers' cost, no more.
	InFlight float64
}

// SpendGrant is LeaseSpend's answer: the slice granted, the key's total
// after it, and what the other writers' slices held unspent (USD) as they
// last recorded them, within their EntryTTL: what of the total may still
// come back (given back, or spent, within spendLeaseIdle).
type SpendGrant struct {
	Granted, Total, Others float64
	// OthersInFlight is what the other writers' holds in flight held
	// (USD) as they last recorded them (SpendLease.InFlight), within
	// their EntryTTL: what of the total may come back when they settle.
	OthersInFlight float64
}

// Lease sizing of a Spending on a SpendLeaser: a slice holds its recent
// demand (USD held per second, weighted over about DemandTau) for
// spendLeaseHorizon; it is renewed in the background below
// spendLeaseLowWater of demand, gives back what exceeds twice the
// horizon's demand, and all it holds once no attempt held any of it for
// spendLeaseIdle.
//
// An attempt the budget has no room for while other instances' slices
// (SpendGrant.Others) would hold it is refused until spendSliceRetry
// from now, not until the window ends: their slices are given back or
// spent within spendLeaseIdle, and the attempt may wait for that within
// its deadline. Each instance records its slice for spendSliceEntry (it
// renews the record at each lease call and look, and a record not renewed
// counts no more: a dead instance's slice makes no one wait past it); an
// idle slice goes back within two idle checks.
const (
	spendLeaseHorizon  = 3 * time.Second
	spendLeaseLowWater = time.Second
	spendLeaseIdle     = 5 * time.Second
	spendSliceRetry    = time.Second
	spendSliceEntry    = 2*spendLeaseIdle + spendLeaseHorizon
)

// leaser returns the store as a SpendLeaser, nil when it is not one;
// under s.mu.
func (s *Spending) leaser() SpendLeaser {
	l, _ := s.store.(SpendLeaser)
	return l
}

// sliceHolds reports whether the slice holds usd, within the margin the
// budget has for the rounding of sums of prices (room's): slices and
// holds are float sums (a grant of an attempt's need, added to what the
// slice held, may come to 0.004999999999999999 for $0.005); under s.mu.
func (s *Spending) sliceHolds(usd float64) bool {
	return s.lease > 0 && usd <= s.lease+s.limit.USD*1e-9
}

// holdLeased holds h from the slice when it holds h.usd, and starts a
// renewal when the slice runs low; under s.mu.
func (s *Spending) holdLeased(now time.Time, h *Hold) bool {
	if h.usd > 0 && !s.sliceHolds(h.usd) {
		return false
	}
	s.lease = max(s.lease-h.usd, 0)
	s.inSlice += h.usd
	h.leased = true
	s.idle++
	s.attempt = h.usd
	if s.lease < s.demand.Over(now, spendLeaseLowWater) && !s.leasing {
		s.leasing = true
		go s.renew(now, s.window)
	}
	return true
}

// leaseFor asks the store, on the request path, for a slice that holds
// h.usd (and the horizon's demand), and holds h from it; it reports
// whether it did, and whether the store answered.
func (s *Spending) leaseFor(now time.Time, l SpendLeaser, h *Hold) (ok, answered bool) {
	s.mu.Lock()
	need := h.usd - s.lease
	limit, i := s.storeLimit(), s.window
	s.mu.Unlock()
	ask := need + s.demandOver(now)
	s.mu.Lock()
	if s.mixed { // another period's window counts this one's spend a carry later: slices of an attempt at a time
		ask = need
	}
	s.mu.Unlock()
	g, err := s.callLease(l, i, need, ask, h.usd, limit)
	s.mu.Lock()
	if err != nil || s.window != i {
		if err == nil {
			s.leased(i, g, now) // a grant of a window rolled past: given back if a reload's carry counts it
		}
		s.mu.Unlock()
		return false, err == nil && !errors.Is(err, errWindowGone)
	}
	s.leased(i, g, now)
	if s.holdLeased(now, h) {
		s.mu.Unlock()
		return true, true
	}
	// The slice cannot hold the attempt and the budget has no more: what
	// it holds goes back, so that another instance's attempt may use it
	// with its own (two fractions neither can use would each wait for the
	// other), and the store learns that this one holds none.
	gave := s.giveBack(0)
	store := s.store
	s.mu.Unlock()
	if gave {
		s.flush(now)
		s.read(now, i, store)
	}
	return false, true
}

// leased folds a grant of window i into the slice; under s.mu.
//
// A grant of the old period's window that lands after a reload rolled
// past it (a lease call in flight across the reload) is in that window's
// total, which the carry counts in the new window as spent (the carry
// waits for this instance's lease calls in flight: carryOver): it goes
// back to the new one, as the slice held at the reload does (roll).
func (s *Spending) leased(i int64, g SpendGrant, now time.Time) {
	if s.window != i {
		if g.Granted > 0 && s.carriedOld == i+1 {
			s.spent -= g.Granted
		}
		return
	}
	s.lease += g.Granted
	s.others, s.othersInFlight = max(g.Others, 0), max(g.OthersInFlight, 0)
	s.learn(i, g.Total, now)
}

// othersHold reports whether a hold of usd would fit if the other
// instances' slices (as they last recorded them) came back; under s.mu.
func (s *Spending) othersHold(usd float64) bool {
	return s.others > 0 && s.leaser() != nil && usd <= s.room()+s.others
}

// GiveBack returns what this instance's slice holds unspent to the
// fleet's budget at now (a negative spend, flushed), as a refused
// attempt's slice goes back (leaseFor): another instance's attempt may
// use it. Nothing without a SpendLeaser or a slice.
func (s *Spending) GiveBack(now time.Time) {
	if s == nil {
		return
	}
	s.mu.Lock()
	gave := s.giveBack(0)
	s.mu.Unlock()
	if gave {
		s.flush(now)
	}
}

// HoldsInFlightWouldHold reports whether a hold of usd that the budget
// has no room for at now would fit once the holds in flight settle (at
// their answers' cost, no more than they hold): this instance's, and the
// fleet's as its instances last recorded them (SpendGrant.OthersInFlight)
// with the slices that may come back. False when nothing is held: the
// budget is spent (or promised to slices) and only its renewal helps. A
// nil Spending holds nothing.
func (s *Spending) HoldsInFlightWouldHold(now time.Time, usd float64) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.roll(now)
	held := s.held + s.inSlice + s.othersInFlight
	return held > 0 && amount(usd) <= s.room()+s.lease+s.othersLeased()+held
}

// refusedUntil is until when a hold of usd refused in window i is
// refused: spendSliceRetry from now when other instances' slices would
// hold it (they come back or are spent soon), else the window's end;
// under s.mu.
func (s *Spending) refusedUntil(now time.Time, i int64, usd float64) time.Time {
	end := s.resetAt(i)
	if s.othersHold(usd) {
		if retry := now.Add(spendSliceRetry); retry.Before(end) {
			return retry
		}
	}
	return end
}

// demandOver is the horizon's demand.
func (s *Spending) demandOver(now time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.demand.Over(now, spendLeaseHorizon)
}

// storeLimit is the limit of the store's total: the budget, less what is
// spent and held here and not in it; under s.mu.
func (s *Spending) storeLimit() float64 {
	return s.limit.USD*(1+1e-9) - s.spent - s.held
}

// callLease leases a slice of window i, within storeTimeout, and schedules
// the idle check of a slice granted.
func (s *Spending) callLease(l SpendLeaser, i int64, need, ask, keep, limit float64) (SpendGrant, error) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	s.mu.Lock()
	if s.window != i || s.released { // a renewal of a window this instance no longer counts (it ended, or a reload rolled past it), or its store closes
		s.mu.Unlock()
		return SpendGrant{}, errWindowGone
	}
	held, inFlight, key, ttl := s.lease, s.inSlice, s.storeKey(i), s.storeTTL() // of window i's period, which a reload may change meanwhile (counted)
	s.leaseCalls++
	s.mu.Unlock()
	g, err := l.LeaseSpend(ctx, SpendLease{Key: key, Need: need, Ask: ask, Keep: keep, Limit: limit,
		TTL: ttl, Writer: s.writer, Held: held, EntryTTL: spendSliceEntry, InFlight: inFlight})
	s.mu.Lock()
	s.leaseCalls--
	if err == nil {
		s.recorded, s.recordedIn = [2]float64{held + g.Granted, inFlight}, i
	}
	s.mu.Unlock()
	if err == nil && g.Granted > 0 {
		s.watchIdle()
		s.track()
	}
	return g, err
}

// SpendTracker is a SpendLeaser that gives back, when it closes, what
// the slices of the Spendings it tracks hold (Release): an instance that
// stops gracefully (a restart, a scale-down) leaves none of its slices
// counted as spent until their windows end.
type SpendTracker interface {
	// TrackSpending tracks s, which leased a slice from it.
	TrackSpending(s *Spending)
}

// track has the store track s, granted a slice (SpendTracker: at each
// grant, a lease call's, so that a store that forgot it learns it again).
func (s *Spending) track() {
	s.mu.Lock()
	t, ok := s.store.(SpendTracker)
	s.mu.Unlock()
	if ok {
		t.TrackSpending(s)
	}
}

// Slice returns what this instance's slice holds unspent (USD; 0 without
// a SpendLeaser or a nil Spending).
func (s *Spending) Slice() float64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease
}

// Sync writes at now what this instance keeps of the budget and not in
// its store (a period's carry first, then what it spent), as its next
// look would: for a report read from the store (nothing without one).
func (s *Spending) Sync(now time.Time) {
	if s == nil || s.store == nil {
		return
	}
	s.mu.Lock()
	s.roll(now)
	s.mu.Unlock()
	s.flush(now)
}

// Unwritten returns what this instance spent, and holds, of the
// budget's current window and has not written to its store (USD; not its
// slice's give-backs still to write): what a report read from the store
// lacks.
func (s *Spending) Unwritten(now time.Time) (spent, held float64) {
	if s == nil || s.store == nil {
		return 0, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.roll(now)
	return max(s.spent, 0), s.held
}

// Release gives back at now what the slice holds unspent (a negative
// spend, written before it returns, within storeTimeout) and records the
// slice as empty in the store (a lease call that asks for nothing), so
// that the fleet may spend it and no one waits for it: the store is
// closing (SpendTracker). Holds in flight keep their part; what they
// settle at later is written if the store still answers.
func (s *Spending) Release(now time.Time) {
	if s == nil {
		return
	}
	s.mu.Lock()
	// A lease call in flight (a renewal) lands first, within
	// storeTimeout, and none is sent after: its grant would stay out.
	s.awaitLocked(func() bool { return s.leaseCalls > 0 })
	s.released = true
	gave, l := s.giveBack(0), s.leaser()
	s.mu.Unlock()
	if gave {
		s.flush(now)
	}
	if l != nil { // the record emptied, by a lease call that asks for nothing
		s.mu.Lock()
		lease := SpendLease{Key: s.storeKey(s.window), Limit: s.storeLimit(), TTL: s.storeTTL(), Writer: s.writer,
			Held: s.lease, EntryTTL: spendSliceEntry, InFlight: s.inSlice}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		_, _ = l.LeaseSpend(ctx, lease)
		cancel()
	}
}

// renew tops up window i's slice for the horizon's demand, in the
// background (one at a time), leaving the fleet room for an attempt as
// large as the last one.
func (s *Spending) renew(now time.Time, i int64) {
	s.mu.Lock()
	l, ask, keep, limit := s.leaser(), s.demand.Over(now, spendLeaseHorizon)-s.lease, s.attempt, s.storeLimit()
	if s.mixed {
		ask = 0 // no slice ahead of demand while another period's window counts this one's spend a carry later
	}
	s.mu.Unlock()
	var g SpendGrant
	var err error
	if l != nil && ask > 0 {
		g, err = s.callLease(l, i, 0, ask, keep, limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leasing = false
	if err == nil && l != nil && ask > 0 {
		s.leased(i, g, now)
	}
}

// settleLeased settles a hold taken from the slice at usd: what it held
// beyond usd goes back to the slice, and what usd exceeds it by is taken
// from the slice, or beyond it spent here (and flushed); it returns the latter; under s.mu.
func (s *Spending) settleLeased(h *Hold, usd float64) float64 {
	s.lease += h.usd - usd
	if s.lease >= 0 {
		return 0
	}
	over := -s.lease
	s.lease = 0
	return over
}

// giveBack returns to the store what the slice holds beyond keep (the
// store's total loses it once flushed: a negative spend, written once per
// SpendOp); it reports whether there is anything to flush; under s.mu.
func (s *Spending) giveBack(keep float64) bool {
	give := s.lease - max(keep, 0)
	if give <= 0 || s.leaser() == nil {
		return false
	}
	s.lease -= give
	s.spent -= give
	s.refreshRecord()
	return true
}

// surplus gives back what the slice holds beyond twice the horizon's
// demand; under s.mu.
func (s *Spending) surplus(now time.Time) bool {
	keep := s.demand.Over(now, spendLeaseHorizon)
	if s.lease <= 2*keep {
		return false
	}
	return s.giveBack(keep)
}

// watchIdle gives back the whole slice once no attempt held any of it
// for spendLeaseIdle (one watch at a time).
func (s *Spending) watchIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watching {
		return
	}
	s.watching = true
	seen := s.idle
	var check func()
	check = func() {
		s.mu.Lock()
		if s.idle != seen {
			seen = s.idle
			s.mu.Unlock()
			time.AfterFunc(spendLeaseIdle, check)
			return
		}
		s.watching = false
		flush := s.giveBack(0)
		s.mu.Unlock()
		if flush {
			s.flush(time.Time{})
		}
	}
	time.AfterFunc(spendLeaseIdle, check)
}

// refreshRecord schedules, when the store's record of this instance (its
// slice and its holds in flight, as of its last lease call) holds more
// than they do now (a hold settled from the slice spent some of it, a
// slice went back), a lease call that asks for nothing in
// spendSliceRetry, which records them as they are then: the other
// instances take a record for what may come back to the budget, and one
// that is spent would make them tell a refusal to retry in a second
// (refusedUntil, HoldsInFlightWouldHold) until this instance leased
// again or its entry expired (spendSliceEntry). At most one call per
// spendSliceRetry, in the background; under s.mu.
func (s *Spending) refreshRecord() {
	if s.refreshing || s.leaser() == nil || !s.recordStale() {
		return
	}
	s.refreshing = true
	time.AfterFunc(spendSliceRetry, func() {
		s.mu.Lock()
		s.refreshing = false
		l, i, limit, stale := s.leaser(), s.window, s.storeLimit(), s.recordStale()
		s.mu.Unlock()
		if !stale || l == nil {
			return
		}
		g, err := s.callLease(l, i, 0, 0, 0, limit)
		if err != nil {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.window == i { // as leased does, but the look's clock is the callers' (their now)
			s.lease += g.Granted
			s.others, s.othersInFlight, s.shared = max(g.Others, 0), max(g.OthersInFlight, 0), g.Total
		}
	})
}

// recordStale reports whether the store's record of this instance, in
// the current window, holds more than its slice and holds in flight do
// (a hold taken from the slice moves what it holds from one to the
// other: the two together may come back); under s.mu.
func (s *Spending) recordStale() bool {
	margin := s.limit.USD * 1e-9
	return s.recordedIn == s.window && s.carry == 0 &&
		s.recorded[0]+s.recorded[1] > s.lease+s.inSlice+margin
}
