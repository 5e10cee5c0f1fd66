package capacity

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

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
// total spent under a key, added to atomically.
type SpendStore interface {
	// AddSpend adds usd to key's total, which expires after ttl, and
	// returns the new total.
	AddSpend(ctx context.Context, key string, usd float64, ttl time.Duration) (float64, error)
	// Spend returns key's total (0 when there is none).
	Spend(ctx context.Context, key string) (float64, error)
}

// Spending counts what one scope (a deployment, a model group) spent in
// the current window of its SpendLimit, alone or, with a SpendStore, with
// the whole fleet. It is safe for concurrent use.
type Spending struct {
	limit SpendLimit
	key   string // the store's key prefix
	store SpendStore

	mu     sync.Mutex
	window int64   // the window counted (its index)
	spent  float64 // in it: this instance's, or the fleet's last known total
	looked time.Time
}

// spendLookEvery is how often a fleet's total is read again while
// nothing is added here: another instance's spend is seen within it.
const spendLookEvery = time.Second

// NewSpending returns the spending of a scope with limit, shared through
// store under key when store is not nil.
func NewSpending(limit SpendLimit, store SpendStore, key string) *Spending {
	return &Spending{limit: limit, store: store, key: key}
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
// window counts against the new one; a new period starts a new window.
func (s *Spending) SetLimit(l SpendLimit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.Period != s.limit.Period {
		s.window, s.spent, s.looked = 0, 0, time.Time{}
	}
	s.limit = l
}

func (s *Spending) index(now time.Time) int64 { return now.UnixNano() / int64(s.limit.Period) }

// resetAt is when the window of index i ends.
func (s *Spending) resetAt(i int64) time.Time { return time.Unix(0, (i+1)*int64(s.limit.Period)) }

func (s *Spending) storeKey(i int64) string { return s.key + ":" + strconv.FormatInt(i, 10) }

// roll starts a new window when now is past the one counted; never an
// older one (a spend stamped just before the boundary that lands after
// it, a clock stepped back): that counts in the current window.
func (s *Spending) roll(now time.Time) int64 {
	if i := s.index(now); i > s.window {
		s.window, s.spent, s.looked = i, 0, time.Time{}
	}
	return s.window
}

// Add counts usd spent at now and reports whether the budget is spent,
// and until when.
func (s *Spending) Add(now time.Time, usd float64) (over bool, until time.Time) {
	if s == nil || !(usd > 0) || math.IsInf(usd, 0) {
		return s.Over(now)
	}
	s.mu.Lock()
	i := s.roll(now)
	s.spent += usd
	store := s.store
	s.mu.Unlock()
	if store != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		total, err := store.AddSpend(ctx, s.storeKey(i), usd, s.limit.Period+time.Minute)
		cancel()
		if err == nil {
			s.mu.Lock()
			if s.window == i {
				s.spent, s.looked = max(total, s.spent), now
			}
			s.mu.Unlock()
		}
	}
	return s.Over(now)
}

// Over reports whether the budget is spent at now, and until when (the
// window's end).
func (s *Spending) Over(now time.Time) (bool, time.Time) {
	if s == nil {
		return false, time.Time{}
	}
	s.mu.Lock()
	i := s.roll(now)
	look := s.store != nil && now.Sub(s.looked) >= spendLookEvery
	if look {
		s.looked = now // one look at a time
	}
	s.mu.Unlock()
	if look {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		total, err := s.store.Spend(ctx, s.storeKey(i))
		cancel()
		if err == nil {
			s.mu.Lock()
			if s.window == i {
				s.spent = max(s.spent, total)
			}
			s.mu.Unlock()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spent >= s.limit.USD, s.resetAt(i)
}

// SpendingReport is a budget and what was spent of it, for display.
type SpendingReport struct {
	// BudgetUSD is the budget, per PeriodSeconds.
	BudgetUSD     float64 `json:"budget_usd"`
	PeriodSeconds float64 `json:"period_seconds"`
	// SpentUSD is what was spent in the current window, which ends at
	// ResetsAt.
	SpentUSD float64   `json:"spent_usd"`
	ResetsAt time.Time `json:"resets_at"`
}

// Report returns the budget and its spending at now (nil without one).
func (s *Spending) Report(now time.Time) *SpendingReport {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.roll(now)
	return &SpendingReport{BudgetUSD: s.limit.USD, PeriodSeconds: s.limit.Period.Seconds(), SpentUSD: s.spent, ResetsAt: s.resetAt(i)}
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
		strconv.FormatFloat(l.USD, 'f', -1, 64), l.Period, until.UTC().Format("2006-01-02 15:04:05"))
}
