package capacity

import (
	"context"
	"time"
)

// SpendLeaser is a SpendStore that leases slices of a budget (fleet mode's
// Redis): a Spending whose store is one holds and settles its attempts
// locally, against its slice, and calls the store only when the slice runs
// low or holds more than its demand (see Spending).
type SpendLeaser interface {
	// LeaseSpend adds a slice to key's total (which expires after ttl)
	// and returns it, with the new total: need and, up to ask (USD), half
	// of what limit leaves beyond need and keep (the rest of the fleet
	// leases the other half, and an attempt of keep fits elsewhere). A
	// budget without room for need grants 0 and returns its total.
	LeaseSpend(ctx context.Context, key string, need, ask, keep, limit float64, ttl time.Duration) (granted, total float64, err error)
}

// Lease sizing of a Spending on a SpendLeaser: a slice holds its recent
// demand (USD held per second, weighted over about DemandTau) for
// spendLeaseHorizon; it is renewed in the background below
// spendLeaseLowWater of demand, gives back what exceeds twice the
// horizon's demand, and all it holds once no attempt held any of it for
// spendLeaseIdle.
const (
	spendLeaseHorizon  = 3 * time.Second
	spendLeaseLowWater = time.Second
	spendLeaseIdle     = 5 * time.Second
)

// leaser returns the store as a SpendLeaser, nil when it is not one;
// under s.mu.
func (s *Spending) leaser() SpendLeaser {
	l, _ := s.store.(SpendLeaser)
	return l
}

// holdLeased holds h from the slice when it holds h.usd, and starts a
// renewal when the slice runs low; under s.mu.
func (s *Spending) holdLeased(now time.Time, h *Hold) bool {
	if h.usd > s.lease {
		return false
	}
	s.lease -= h.usd
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
	granted, total, err := s.callLease(l, i, need, need+s.demandOver(now), h.usd, limit)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || s.window != i {
		return false, err == nil
	}
	s.lease += granted
	s.learn(i, total, now)
	return s.holdLeased(now, h), true
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
func (s *Spending) callLease(l SpendLeaser, i int64, need, ask, keep, limit float64) (granted, total float64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	granted, total, err = l.LeaseSpend(ctx, s.storeKey(i), need, ask, keep, limit, s.limit.Period+time.Minute)
	if err == nil && granted > 0 {
		s.watchIdle()
	}
	return granted, total, err
}

// renew tops up window i's slice for the horizon's demand, in the
// background (one at a time), leaving the fleet room for an attempt as
// large as the last one.
func (s *Spending) renew(now time.Time, i int64) {
	s.mu.Lock()
	l, ask, keep, limit := s.leaser(), s.demand.Over(now, spendLeaseHorizon)-s.lease, s.attempt, s.storeLimit()
	s.mu.Unlock()
	var granted, total float64
	var err error
	if l != nil && ask > 0 {
		granted, total, err = s.callLease(l, i, 0, ask, keep, limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leasing = false
	if err == nil && granted > 0 && s.window == i {
		s.lease += granted
		s.learn(i, total, now)
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
