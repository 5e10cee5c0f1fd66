package capacity

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/period"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// SpendLimit is a budget: at most USD per Period, in fixed windows that
// begin at multiples of Period since the Unix epoch (UTC): "per 24h"
// renews at midnight UTC, "per 1h" on the hour.
type SpendLimit struct {
	USD    float64
	Period time.Duration
}

// SpendStore shares spending across a fleet (fleet mode's Redis): the
// total spent and held under a key, added to atomically.
type SpendStore interface {
	// AddSpend adds usd (less than 0: a hold given back) to key's total,
	// which expires after ttl, and returns the new total. It is
	// idempotent per op: a write of op's writer with a Seq at most the
	// last one applied to key is not added again (a retry of a write
	// whose reply was lost); it returns the total then too.
	AddSpend(ctx context.Context, key string, usd float64, op SpendOp, ttl time.Duration) (float64, error)
	// HoldSpend adds usd to key's total, which expires after ttl, only if
	// the total stays at most limit; it reports whether it did, and the
	// total (the new one, or the one that had no room).
	HoldSpend(ctx context.Context, key string, usd, limit float64, ttl time.Duration) (bool, float64, error)
	// Spend returns key's total (0 when there is none).
	Spend(ctx context.Context, key string) (float64, error)
}

// SpendCarrier is a SpendStore that carries one window's total into
// another's (a reload changed the budget's period: the new period's
// window of now counts what the old period's spent), once however many
// instances carry it.
type SpendCarrier interface {
	// CarrySpend adds to key's total (which expires after ttl) what
	// from's total has beyond what was carried from it into key before
	// (nothing when it has less: a carry never takes back), and returns
	// key's total. Each instance that changes the period carries, after
	// its own writes to from: the total carried is from's largest seen.
	CarrySpend(ctx context.Context, from, key string, ttl time.Duration) (float64, error)
	// SpendPeriods records per as a period in use of the budget whose
	// keys start with base, for ttl, and returns the other periods
	// recorded and not expired: a Spending started with a new period (a
	// restart, not a reload: SetLimit) carries their windows of now into
	// its own, as a reload does.
	SpendPeriods(ctx context.Context, base string, per, ttl time.Duration) ([]PeriodInUse, error)
}

// PeriodInUse is another period of a budget recorded in use
// (SpendCarrier.SpendPeriods): Period, and Age, how long ago an instance
// last recorded it (a negative Age: unknown).
type PeriodInUse struct {
	Period, Age time.Duration
}

// Carries while the instances run different periods of one budget (a
// rolling restart or reload that changes it): an instance records its
// period every periodsEvery, or every spendLookEvery while another
// period was recorded within periodLive (instances running it), and
// carries that period's window of now into its own each time, so that
// each window counts what the other spends within about a second (the
// carries subtract what each window holds carried from the other: both
// count the sum).
const (
	periodsEvery = 5 * time.Second
	periodLive   = 3 * periodsEvery
)

// SpendOp names a write to a SpendStore: its writer (one Spending of one
// instance) and its sequence number, from 1, increasing with each write
// of that writer.
type SpendOp struct {
	Writer string
	Seq    int64
	// Record, with a SpendLeaser, has the write record the writer's slice
	// and its holds in flight (USD) as they were when it was made, for
	// EntryTTL, as a lease call does (SpendLease.Held, InFlight): a slice
	// given back leaves no record of it behind.
	Record          bool
	Slice, InFlight float64
	EntryTTL        time.Duration
}

// Spending counts what one scope (a deployment, a model group) spent and
// holds in the current window of its SpendLimit, alone or, with a
// SpendStore, with the whole fleet. An attempt holds its worst-case cost
// (Hold) before it is sent, and settles it with what its answer cost
// (Settle): the budget is never promised twice. It is safe for concurrent
// use.
//
// In fleet mode the store's total is the fleet's spend and holds, and a
// hold is taken there atomically. While the store cannot be reached
// (ErrUnavailable, a timeout), an instance decides on what it knows: the
// fleet's total as last read, plus what it spent and held itself since,
// which it keeps to itself; each instance may then spend what the fleet
// has left, so a fleet of n may overspend up to n times that until the
// store is back. What it spent meanwhile is kept (per window) and added
// to the store's total once the store answers again (reconciliation):
// on its next call to the store, or a retry every spendRetryEvery; a
// window ended by then drops it. Each write carries a SpendOp and a
// failed one is retried as is, so a write applied whose reply was lost
// is never counted twice.
//
// With a store that leases (SpendLeaser, fleet mode's Redis), an instance
// holds and settles attempts against its slice of the budget, in memory,
// and calls the store only for a new slice (spendlease.go); the store's
// total counts the slices out, so a slice another instance holds counts as
// spent here (Over, Report) until it is given back.
type Spending struct {
	limit SpendLimit
	key   string // the store's key prefix
	store SpendStore

	mu     sync.Mutex
	window int64         // the window counted (its index)
	carry  time.Duration // the period window counts in, after SetLimit changed it (0: limit's)
	// carryFrom is, after a new period in fleet mode (a SpendCarrier),
	// the store's key of the old period's window whose total is still to
	// be carried into the current window's (flush); "" when none.
	carryFrom string
	carryMore []string // the other windows to carry after carryFrom (registerPeriods)
	// pushes are carries of the current window into other periods'
	// windows of now, in use by running instances (recordPeriod), after
	// the carries into it.
	pushes []push
	// periodsIn is the window (its index + 1) in which this Spending last
	// recorded its period in the store (SpendCarrier.SpendPeriods), 0
	// none; periodsDone, it did once (and carried the other periods'
	// windows then).
	periodsIn   int64
	periodsDone bool
	// periodsNext is when (real time) to record the period again, mixed
	// whether another period was recorded within periodLive then.
	periodsNext time.Time
	mixed       bool
	firstIn     int64 // the window (index + 1) of its first record
	// carriedOld is the old period's window (its index + 1) a reload
	// rolled past and carries (0: none); leaseCalls counts the lease
	// calls in flight, which the carry waits for (carryOver).
	carriedOld int64
	leaseCalls int
	released   bool // its store is closing (Release): no lease call more
	// byPeriod names the period in the store's keys (NewSpendingByPeriod).
	byPeriod bool
	shared   float64 // in it: the fleet's total (spent and held) as the store last stated it
	spent    float64 // in it: spent here and not in the store (all of it without a store)
	held     float64 // in it: held here and not in the store
	looked   time.Time
	// lease is, with a SpendLeaser, what this instance leased of the
	// window (in the store's total) and neither holds nor spent.
	lease   float64
	inSlice float64 // what the holds taken from the slice in the window and not settled hold (USD)
	demand  Demand
	others  float64 // the other instances' slices as the last lease call told them
	// othersInFlight is what the other instances' holds in flight held
	// as the last lease call told (SpendGrant.OthersInFlight).
	othersInFlight float64
	leasing        bool    // a renewal is under way
	watching       bool    // an idle check is scheduled
	idle           int64   // holds taken from the slice (the idle check's clock)
	attempt        float64 // the last hold taken from the slice (USD)
	// recorded is what the store records of this instance (its slice and
	// its holds in flight, USD) as of its last lease call in window
	// recordedIn; refreshing, a refresh of a stale record is scheduled
	// (refreshRecord).
	recorded   [2]float64
	recordedIn int64
	refreshing bool

	writer   string   // this Spending's name in its SpendOps
	seq      int64    // the last SpendOp's Seq
	op       *spendOp // the write sent and not known applied, to send again as is
	flushing bool     // a flush is under way (one at a time: Seqs arrive in order)
	retrying bool     // a retry is scheduled
}

// spendOp is a write of what was spent here (spent) to the store.
type spendOp struct {
	SpendOp
	usd    float64
	window int64  // -1: a window of a period past (SetLimit)
	key    string // the store's key of window
}

// Hold is an attempt's hold on a budget: its worst-case cost, given back
// (and what it cost spent instead) by Settle.
type Hold struct {
	usd    float64
	window int64
	shared bool // counted in the store's total
	leased bool // taken from the instance's slice (itself in the store's total)
	done   bool // settled (under the Spending's lock)
}

// spendLookEvery is how often a fleet's total is read again while
// nothing is added here: another instance's spend is seen within it.
const spendLookEvery = time.Second

// storeTimeout bounds each call to the store.
const storeTimeout = time.Second

// spendRetryEvery is how often spend not yet in the store is written
// again while the store does not answer.
const spendRetryEvery = time.Second

// NewSpending returns the spending of a scope with limit, shared through
// store under key when store is not nil.
func NewSpending(limit SpendLimit, store SpendStore, key string) *Spending {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Spending{limit: limit, store: store, key: key, writer: hex.EncodeToString(b[:])}
}

// NewSpendingByPeriod is NewSpending whose store keys name the period as
// well as the window (key:24h0m0s:<window>; NewSpending's: key:<window>).
func NewSpendingByPeriod(limit SpendLimit, store SpendStore, key string) *Spending {
	s := NewSpending(limit, store, key)
	s.byPeriod = true
	return s
}

// SetStore shares the spending through store from now on (nil: this
// instance alone): a reload may turn fleet mode on or off.
func (s *Spending) SetStore(store SpendStore) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store, s.looked = store, time.Time{}
}

// Limit returns the budget.
func (s *Spending) Limit() SpendLimit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
}

// SetLimit changes the budget (a reload): what was spent in the current
// window counts against the new one. A new period carries what the
// current window spent into the new period's window of the next look
// (roll), unless the old window has ended by then: a reload forgives
// nothing. In fleet mode (a SpendCarrier) the fleet's total of the old
// period's window of that look is carried into the new period's window
// in the store, once fleet-wide (flush), whichever instance reloads
// first; the new window ends as the new period's windows do. A store
// that cannot carry starts a new window.
func (s *Spending) SetLimit(l SpendLimit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, carrier := s.store.(SpendCarrier)
	switch {
	case l.Period == s.limit.Period:
	case s.carry > 0: // a second change before a look: the window counted is still the first period's
	case (s.store == nil || carrier) && s.limit.Period > 0:
		// The holds in flight settle as of a window past (Settle): what
		// they cost is spent in the new one.
		s.carry, s.held = s.limit.Period, 0
	default:
		s.window, s.shared, s.spent, s.held, s.looked, s.op, s.lease, s.others, s.othersInFlight = 0, 0, 0, 0, time.Time{}, nil, 0, 0, 0
	}
	s.limit = l
}

func (s *Spending) index(now time.Time) int64 { return now.UnixNano() / int64(s.limit.Period) }

// resetAt is when the window of index i ends.
func (s *Spending) resetAt(i int64) time.Time { return time.Unix(0, (i+1)*int64(s.limit.Period)) }

// StoreKey returns the store's key of the window of now (the key a
// SpendStore is called with for it; "" for a nil Spending).
func (s *Spending) StoreKey(now time.Time) string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.storeKey(s.roll(now))
}

// storeKey is the store's key of window i of the period the current
// window counts in (counted); under s.mu.
func (s *Spending) storeKey(i int64) string { return s.storeKeyOf(s.counted(), i) }

// storeTTL is how long the store keeps a key of the current window's
// period: the period and a minute; under s.mu.
func (s *Spending) storeTTL() time.Duration { return s.counted() + time.Minute }

// counted is the period the current window (s.window) counts in: the
// old one after SetLimit changed it, until the next look rolls into the
// new one; under s.mu. A call made for a window of the old period (a
// slice renewed in the background, a write retried) writes to that
// window's key, which the carry counts in the new one: with the new
// period's key for the old index it would write to another window.
func (s *Spending) counted() time.Duration {
	if s.carry > 0 {
		return s.carry
	}
	return s.limit.Period
}

// storeKeyOf is the store's key of window i of period per.
func (s *Spending) storeKeyOf(per time.Duration, i int64) string {
	if s.byPeriod {
		return s.key + ":" + per.String() + ":" + strconv.FormatInt(i, 10)
	}
	return s.key + ":" + strconv.FormatInt(i, 10)
}

// roll starts a new window when now is past the one counted; never an
// older one (a spend stamped just before the boundary that lands after
// it, a clock stepped back): that counts in the current window.
func (s *Spending) roll(now time.Time) int64 {
	if s.carry > 0 { // a new period (SetLimit)
		old := now.UnixNano() / int64(s.carry)
		if old != s.window {
			// The old window had ended: nothing this instance counted
			// is of the old period's window of now.
			s.shared, s.spent, s.held, s.op, s.lease, s.inSlice, s.others, s.othersInFlight = 0, 0, 0, nil, 0, 0, 0, 0
		}
		if _, ok := s.store.(SpendCarrier); ok {
			// The store's total of the old period's window of now is
			// carried into the new one's (flush, before this instance
			// writes there), which counts it then; what this instance's
			// slice and the holds taken from it hold goes back (they are
			// in that total: its holds settle as of a window past, and
			// what they cost is spent in the new one). Until the carry
			// lands, the total last seen counts (shared).
			s.spent -= s.lease + s.inSlice
			s.lease, s.inSlice, s.others, s.othersInFlight, s.looked = 0, 0, 0, 0, time.Time{}
			s.carryFrom, s.carryMore, s.carriedOld = s.storeKeyOf(s.carry, old), nil, old+1
			if s.op != nil {
				s.op.window = -1 // a write to the old window, sent before the carry
			}
		}
		s.window, s.carry = s.index(now), 0
		return s.window
	}
	if i := s.index(now); i > s.window {
		s.window, s.shared, s.spent, s.held, s.looked = i, 0, 0, 0, time.Time{}
		s.op, s.lease, s.inSlice, s.others, s.othersInFlight = nil, 0, 0, 0, 0 // what the ended window did not write is dropped, its slice with its key
		s.carryFrom, s.carryMore = "", nil                                     // the new period's window carried into has ended too
	}
	return s.window
}

// used is what the current window has spent and holds, as far as this
// instance knows.
func (s *Spending) used() float64 { return s.shared + s.spent + s.held }

// room is what is left of the budget for a hold, with a margin for the
// rounding of sums of prices.
func (s *Spending) room() float64 { return s.limit.USD*(1+1e-9) - s.used() }

// amount is usd as a cost: 0 for a negative, infinite or NaN one.
func amount(usd float64) float64 {
	if !(usd > 0) || math.IsInf(usd, 0) {
		return 0
	}
	return usd
}

// Hold holds usd, an attempt's worst-case cost, at now when the budget
// has room for it (what was spent and is held, fleet-wide in fleet mode,
// plus usd, at most the budget; nothing fits a budget spent): h is then
// to be settled (Settle) once the attempt ends. Otherwise ok is false and
// until is when the window renews. A nil Spending (no budget) holds
// nothing and always fits.
func (s *Spending) Hold(now time.Time, usd float64) (h *Hold, ok bool, until time.Time) {
	if s == nil {
		return nil, true, time.Time{}
	}
	usd = amount(usd)
	s.mu.Lock()
	i := s.roll(now)
	until = s.resetAt(i)
	h = &Hold{usd: usd, window: i}
	if s.carryFrom != "" || s.firstLook() {
		// The old period's total is carried first (flush), as other
		// periods of the budget in use when this Spending started are: a
		// slice or a hold of the new window before it would not count it.
		s.mu.Unlock()
		s.flush(now)
		s.mu.Lock()
		// Another hold's flush may be carrying (flush is one at a time):
		// it lands within storeTimeout, or the store did not answer.
		s.awaitLocked(func() bool { return (s.carryFrom != "" || s.firstLook()) && s.flushing })
		i = s.roll(now)
		until = s.resetAt(i)
		h.window = i
		if s.carryFrom != "" || s.firstLook() { // the store did not answer: what this instance knows decides
			if ok = s.holdHere(h); !ok {
				h = nil
			}
			s.mu.Unlock()
			return h, ok, until
		}
	}
	if s.unrecorded() && !s.flushing {
		go s.flush(now) // the period recorded again, and another one's window carried (periodsEvery), off the request path
	}
	store, limit, key, ttl := s.store, s.storeLimit(), s.storeKey(i), s.storeTTL()
	if store == nil {
		ok = s.holdHere(h)
		s.mu.Unlock()
		return h, ok, until
	}
	if l := s.leaser(); l != nil {
		s.demand.Add(now, usd)
		if s.holdLeased(now, h) {
			s.mu.Unlock()
			return h, true, until
		}
		s.mu.Unlock()
		if ok, answered := s.leaseFor(now, l, h); answered {
			if !ok {
				s.mu.Lock()
				h, until = nil, s.refusedUntil(now, i, usd)
				s.mu.Unlock()
			}
			return h, ok, until
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if ok = s.window != i || s.holdHere(h); !ok { // unreachable: what this instance knows decides
			h = nil
		}
		return h, ok, until
	}
	s.mu.Unlock()
	// The store's total decides, atomically (what this instance spent and
	// held while it was unreachable counts too).
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	fits, total, err := store.HoldSpend(ctx, key, usd, limit, ttl)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil:
		// The store unreachable: what this instance knows decides.
		ok = s.window != i || s.holdHere(h) // a window rolled meanwhile: it counts nowhere
	case fits:
		h.shared, ok = true, true
		s.learn(i, total, now)
	default:
		s.learn(i, total, now)
	}
	if !ok {
		h = nil
	}
	return h, ok, until
}

// holdHere holds h in this instance's count when the budget has room for
// it (nothing fits a budget spent); under s.mu.
func (s *Spending) holdHere(h *Hold) bool {
	if s.used() >= s.limit.USD || h.usd > s.room() {
		return false
	}
	s.held += h.usd
	return true
}

// learn takes total as the fleet's total of window i, read at now.
func (s *Spending) learn(i int64, total float64, now time.Time) {
	if s.window == i {
		s.shared, s.looked = total, now
	}
}

// Settle spends usd at now, what an attempt cost, and gives back its hold
// h (nil: none) in the same step, so that no other hold takes the
// difference in between; a hold is settled once (again: only usd is
// spent). A hold of a window already past is given back there; usd
// counts in the current window. It reports whether the budget is spent
// at now (spent and held), and until when.
func (s *Spending) Settle(now time.Time, h *Hold, usd float64) (over bool, until time.Time) {
	if s == nil {
		return false, time.Time{}
	}
	usd = amount(usd)
	s.mu.Lock()
	i := s.roll(now)
	delta := usd // what the store's total gains
	if h != nil && !h.done {
		h.done = true
		switch {
		case h.window != i:
		case h.leased:
			s.inSlice = max(0, s.inSlice-h.usd)
			delta = s.settleLeased(h, usd)
			s.refreshRecord()
		case h.shared:
			delta -= h.usd
		default:
			s.held = max(0, s.held-h.usd)
		}
	}
	s.spent += delta // in the store's total once flushed
	flush := s.store != nil && (delta != 0 || s.surplus(now))
	s.mu.Unlock()
	if flush {
		s.flush(now)
	}
	return s.Over(now)
}

// flush writes what was spent here and not in the store (s.spent) to
// the store, one write at a time: a write that failed first, as it was
// (it may have been applied), then the rest. Until it succeeds it is
// retried every spendRetryEvery, and on every call that flushes.
func (s *Spending) flush(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.flushing || s.store == nil {
		return
	}
	s.flushing = true
	defer func() { s.flushing = false }()
	for {
		if s.op == nil && s.carryFrom == "" && s.unrecorded() {
			// The period is recorded in use in each window; the first
			// time, the other periods' windows of now are carried.
			if !s.recordPeriod(now) {
				s.retryLater()
				return
			}
			continue
		}
		if s.op == nil && s.carryFrom != "" {
			// A new period's window: the old one's total is carried
			// into it first, after this instance's writes to the old one.
			if !s.carryOver(now) {
				s.retryLater()
				return
			}
			continue
		}
		if s.op == nil && len(s.pushes) > 0 {
			if !s.pushOver() {
				s.retryLater()
				return
			}
			continue
		}
		if s.op == nil {
			if s.spent == 0 {
				return
			}
			s.seq++
			s.op = &spendOp{SpendOp: SpendOp{Writer: s.writer, Seq: s.seq}, usd: s.spent, window: s.window, key: s.storeKey(s.window)}
			if s.leaser() != nil && s.carry == 0 {
				s.op.Record, s.op.Slice, s.op.InFlight, s.op.EntryTTL = true, s.lease, s.inSlice, spendSliceEntry
			}
		}
		op, store, ttl := *s.op, s.store, s.storeTTL()
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		total, err := store.AddSpend(ctx, op.key, op.usd, op.SpendOp, ttl)
		cancel()
		s.mu.Lock()
		if err != nil {
			s.retryLater()
			return
		}
		if s.op != nil && s.op.SpendOp == op.SpendOp {
			s.op, s.spent = nil, s.spent-op.usd
			if op.Record && op.window == s.window {
				s.recorded, s.recordedIn = [2]float64{op.Slice, op.InFlight}, op.window
			}
			s.learn(op.window, total, now)
		}
	}
}

// carryOver carries the old period's window's total (carryFrom) into the
// current window's, in the store; it reports whether it did (or there is
// nothing to carry any more); under s.mu, which it releases for the call.
func (s *Spending) carryOver(now time.Time) bool {
	c, ok := s.store.(SpendCarrier)
	if !ok {
		s.carryFrom = ""
		return true
	}
	// A lease call of this instance in flight to the old window lands
	// there first, so that the carry counts its grant (which goes back to
	// the new window when it lands: leased), within storeTimeout.
	s.awaitLocked(func() bool { return s.leaseCalls > 0 })
	from, i := s.carryFrom, s.window
	key, ttl := s.storeKey(i), s.storeTTL()
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	total, err := c.CarrySpend(ctx, from, key, ttl)
	cancel()
	s.mu.Lock()
	if err != nil {
		return false
	}
	if s.carryFrom == from && s.window == i {
		s.carryFrom = ""
		if len(s.carryMore) > 0 {
			s.carryFrom, s.carryMore = s.carryMore[0], s.carryMore[1:]
		}
		s.learn(i, total, now)
	}
	return true
}

// push is a carry of window from into another period's window to (its
// key expiring after ttl).
type push struct {
	from, to string
	ttl      time.Duration
}

// pushOver carries the first of the pushes; it reports whether the store
// answered (the push is then done); under s.mu, which it releases for
// the call.
func (s *Spending) pushOver() bool {
	c, ok := s.store.(SpendCarrier)
	p := s.pushes[0]
	if !ok {
		s.pushes = nil
		return true
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	_, err := c.CarrySpend(ctx, p.from, p.to, p.ttl)
	cancel()
	s.mu.Lock()
	if err != nil {
		return false
	}
	if len(s.pushes) > 0 && s.pushes[0] == p {
		s.pushes = s.pushes[1:]
	}
	return true
}

// awaitLocked waits while busy holds, for another goroutine's store call
// (a carry, a lease call in flight), within storeTimeout; under s.mu,
// which it releases while it waits.
func (s *Spending) awaitLocked(busy func() bool) {
	for wait := time.Now().Add(storeTimeout); busy() && time.Now().Before(wait); {
		s.mu.Unlock()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
	}
}

// unrecorded reports whether this Spending's period is still to be
// recorded in the store in the current window (a SpendCarrier); under
// s.mu.
func (s *Spending) unrecorded() bool {
	_, ok := s.store.(SpendCarrier)
	return ok && s.limit.Period > 0 && s.carry == 0 && (s.periodsIn != s.window+1 || !time.Now().Before(s.periodsNext))
}

// firstLook reports whether this Spending has never recorded its period
// in the store (and so not carried the other periods in use); under s.mu.
func (s *Spending) firstLook() bool { return !s.periodsDone && s.unrecorded() }

// recordPeriod records the period in use in the store for the current
// window (SpendCarrier.SpendPeriods: a period and a minute), and carries
// the window of now of every other period recorded, the first time
// (carryFrom, carryMore: a restart that changed the period forgives
// nothing, as a reload does not), and then of those recorded within
// periodLive (instances still running them); it reports whether the store answered;
// under s.mu, which it releases for the call. now zero (a retry): the
// current window's start.
func (s *Spending) recordPeriod(now time.Time) bool {
	c := s.store.(SpendCarrier)
	per, i, first := s.limit.Period, s.window, !s.periodsDone
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	others, err := c.SpendPeriods(ctx, s.key, per, per+time.Minute)
	cancel()
	s.mu.Lock()
	if err != nil {
		return false
	}
	if s.window != i || s.limit.Period != per || s.carry != 0 {
		return true // rolled or reloaded meanwhile: the next turn decides
	}
	s.periodsIn = i + 1
	at := now
	if at.IsZero() || s.index(at) != i {
		at = time.Unix(0, i*int64(per))
	}
	s.mixed = false
	for _, q := range others {
		live := q.Age >= 0 && q.Age <= periodLive
		s.mixed = s.mixed || live
		if q.Period > 0 && q.Period != per && (first || live) && s.carryFrom == "" {
			other := s.storeKeyOf(q.Period, at.UnixNano()/int64(q.Period))
			if first || s.firstIn == i+1 { // in a later window of its own, the other's window holds spend of this one's windows past
				s.carryMore = append(s.carryMore, other)
			}
			if live && len(s.pushes) < 8 { // its instances count this window's spend too
				s.pushes = append(s.pushes, push{from: s.storeKey(i), to: other, ttl: q.Period + time.Minute})
			}
		}
	}
	if first {
		s.firstIn = i + 1
	}
	s.periodsDone = true
	if s.periodsNext = time.Now().Add(periodsEvery); s.mixed {
		s.periodsNext = time.Now().Add(spendLookEvery)
	}
	if s.carryFrom == "" && len(s.carryMore) > 0 {
		s.carryFrom, s.carryMore = s.carryMore[0], s.carryMore[1:]
	}
	return true
}

// retryLater schedules a flush in spendRetryEvery (one at a time), to
// write what is kept here once the store answers though no request
// calls it; under s.mu.
func (s *Spending) retryLater() {
	if s.retrying {
		return
	}
	s.retrying = true
	time.AfterFunc(spendRetryEvery, func() {
		s.mu.Lock()
		s.retrying = false
		s.mu.Unlock()
		s.flush(time.Time{}) // a zero time: the total is read again at the next look
	})
}

// Add counts usd spent at now, with no hold (Settle's), and reports
// whether the budget is spent, and until when.
func (s *Spending) Add(now time.Time, usd float64) (over bool, until time.Time) {
	return s.Settle(now, nil, usd)
}

// Over reports whether the budget is spent at now, and until when (the
// window's end): what was spent reaches it (in fleet mode: the fleet's
// total, its holds included; this instance's own holds not in it do not
// count, see Fits).
func (s *Spending) Over(now time.Time) (bool, time.Time) {
	if s == nil {
		return false, time.Time{}
	}
	i := s.look(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shared-s.lease-s.othersLeased()+s.spent >= s.limit.USD, s.resetAt(i)
}

// othersLeased is what of the fleet's total the other instances' slices
// held as the last lease call told (0 without a SpendLeaser): not spent
// yet, and soon given back or spent; under s.mu.
func (s *Spending) othersLeased() float64 {
	if s.leaser() == nil {
		return 0
	}
	return s.others
}

// Left returns what of the budget a hold may still take at now, as this
// instance knows it (USD, 0 when nothing; a nil Spending: +Inf): the
// budget less what was spent and is held (in fleet mode the fleet's total
// as the store last told it, and what this instance spent and holds
// outside it), plus this instance's unspent slice. It asks the store
// nothing: a hold of more than the store has left is refused by Hold,
// which learns the store's total.
func (s *Spending) Left(now time.Time) float64 {
	if s == nil {
		return math.Inf(1)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.roll(now)
	return max(s.room()+s.lease, 0)
}

// Fits reports whether a hold of usd would fit at now (as Hold, without
// holding it), and until when the window lasts.
func (s *Spending) Fits(now time.Time, usd float64) (bool, time.Time) {
	if s == nil {
		return true, time.Time{}
	}
	i := s.look(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	if usd = amount(usd); s.sliceHolds(usd) {
		return true, s.resetAt(i)
	}
	if s.used() < s.limit.USD && usd <= s.room() {
		return true, s.resetAt(i)
	}
	return false, s.refusedUntil(now, i, usd)
}

// look reads the fleet's total again when it was last read (or learned)
// spendLookEvery ago or more, and returns the current window.
func (s *Spending) look(now time.Time) int64 {
	s.mu.Lock()
	i := s.roll(now)
	look := s.store != nil && now.Sub(s.looked) >= spendLookEvery
	if look {
		s.looked = now // one look at a time
	}
	store, kept := s.store, s.spent != 0 || s.op != nil || s.carryFrom != "" || s.unrecorded()
	s.mu.Unlock()
	if look && kept {
		s.flush(now) // what is kept here first: the total read then has it
	}
	if look {
		s.read(now, i, store)
	}
	return i
}

// read reads window i's total from store; from a SpendLeaser, with what
// the other instances' slices hold, by a lease call that asks for nothing
// (it renews this instance's record of its slice too).
func (s *Spending) read(now time.Time, i int64, store SpendStore) {
	s.mu.Lock()
	carrying, key := s.carryFrom != "", s.storeKey(i)
	s.mu.Unlock()
	if carrying {
		return // the new window's total without the old one's: the one last seen counts
	}
	if l, ok := store.(SpendLeaser); ok {
		s.mu.Lock()
		limit := s.storeLimit()
		s.mu.Unlock()
		if g, err := s.callLease(l, i, 0, 0, 0, limit); err == nil {
			s.mu.Lock()
			s.leased(i, g, now)
			s.mu.Unlock()
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	total, err := store.Spend(ctx, key)
	cancel()
	if err == nil {
		s.mu.Lock()
		s.learn(i, total, now)
		s.mu.Unlock()
	}
}

// SpendingReport is a budget and what was spent of it, for display.
type SpendingReport struct {
	// BudgetUSD is the budget, per PeriodSeconds.
	BudgetUSD     float64 `json:"budget_usd"`
	PeriodSeconds float64 `json:"period_seconds"`
	// SpentUSD is what was spent in the current window, which ends at
	// ResetsAt; in fleet mode with the holds of attempts under way across
	// the fleet (the store keeps one total).
	SpentUSD float64   `json:"spent_usd"`
	ResetsAt time.Time `json:"resets_at"`
	// HeldUSD is what attempts under way here hold of it (their
	// worst-case cost) and is not in SpentUSD.
	HeldUSD float64 `json:"held_usd"`
}

// Report returns the budget and its spending at now (nil without one).
func (s *Spending) Report(now time.Time) *SpendingReport {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.roll(now)
	return &SpendingReport{BudgetUSD: s.limit.USD, PeriodSeconds: s.limit.Period.Seconds(),
		SpentUSD: RoundUSD(s.shared - s.lease + s.spent), HeldUSD: RoundUSD(s.held), ResetsAt: s.resetAt(i)}
}

// BudgetSpent says whether the deployment's budget is spent at now: until
// until it is out, as a spent quota (class quota_exhausted; msg says why);
// a zero until, it is not (a new window, a budget raised by a reload). Its
// circuit and stated windows are not touched. It reports whether the
// budget has just become spent (it was not before), for a log line.
func (s *State) BudgetSpent(now, until time.Time, msg string) (changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.budgetUntil.After(now)
	if until.After(now) {
		s.budgetUntil = until
		if !was {
			s.lastClass, s.lastAt, s.lastMessage = provider.QuotaExhausted, now, msg
		}
		return !was
	}
	s.budgetUntil = time.Time{}
	return false
}

// BudgetMessage is why a budget stops a deployment or a group: "budget of
// $5 per 24h spent (resets at 00:00:00 UTC)".
func BudgetMessage(l SpendLimit, until time.Time) string {
	return fmt.Sprintf("budget of $%s per %s spent (it renews at %s UTC)",
		strconv.FormatFloat(l.USD, 'f', -1, 64), period.String(l.Period), until.UTC().Format("2006-01-02 15:04:05"))
}
