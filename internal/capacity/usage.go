package capacity

import (
	"math"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Spend is what a deployment's answers used: the tokens their providers
// counted, and what they cost at the deployment's prices.
type Spend struct {
	// Answers counts the answers whose usage the provider stated.
	Answers int64 `json:"answers"`
	provider.Usage
	// CostUSD is their cost in USD (0 when the deployment has no prices).
	CostUSD float64 `json:"cost_usd"`
}

func (s *Spend) add(u provider.Usage, cost float64) {
	s.plus(Spend{Answers: 1, Usage: u, CostUSD: cost})
}

// plus adds o, each count saturating at the int64 limit (a provider's
// garbage must not wrap a total negative).
func (s *Spend) plus(o Spend) {
	sat := func(a *int64, b int64) {
		if b > 0 && *a > math.MaxInt64-b {
			*a = math.MaxInt64
			return
		}
		*a += max(b, 0)
	}
	sat(&s.Answers, o.Answers)
	sat(&s.InputTokens, o.InputTokens)
	sat(&s.CachedInputTokens, o.CachedInputTokens)
	sat(&s.CacheWriteTokens, o.CacheWriteTokens)
	sat(&s.CacheWrite1hTokens, o.CacheWrite1hTokens)
	sat(&s.OutputTokens, o.OutputTokens)
	sat(&s.ReasoningTokens, o.ReasoningTokens)
	if o.CostUSD > 0 && !math.IsInf(o.CostUSD, 0) {
		s.CostUSD = RoundUSD(s.CostUSD + o.CostUSD)
	}
}

// USDResolution is the smallest amount of USD the router counts, a
// millionth of a micro-dollar: an answer's cost is its tokens times
// prices per 1M tokens, so that a cost or a sum of costs in float64
// carries binary noise below it (0.1 + 0.2 is 0.30000000000000004;
// (0.7 + 5) / 1e6 is 0.0000057000000000000005), which reports would
// print.
const USDResolution = 1e-12

// RoundUSD rounds usd to USDResolution, so that it is the float64
// nearest to its decimal and prints as that (0.3, 0.0000057). Past
// about 9,000 USD float64 holds no digit that fine and usd is kept as
// it is.
func RoundUSD(usd float64) float64 {
	const units = 1 / USDResolution // exact in float64, as its quotients are
	if math.Abs(usd) >= 1<<53/units || math.IsNaN(usd) {
		return usd
	}
	return math.Round(usd*units) / units
}

// ledger keeps a deployment's spend since the process started (it lives
// with the State, across reloads) and by minute over the last hour, and
// the attempts it failed over from, by class.
type ledger struct {
	total     Spend
	minutes   [60]Spend
	minuteOf  [60]int64 // the Unix minute each slot holds
	failovers [16]int64 // by provider.Class
}

// UsageReport is a deployment's spend, for display (admin API, status page).
type UsageReport struct {
	// Total is since the process started; LastHour over the last 60
	// minutes (by whole minutes).
	Total    Spend `json:"total"`
	LastHour Spend `json:"last_hour"`
	// Failovers counts the attempts on the deployment that failed and were
	// failed over from, by class ("rate_limited", "overloaded", ...).
	Failovers map[string]int64 `json:"failovers"`
}

// RecordUsage adds one answer's usage u, which cost cost USD, at now.
func (s *State) RecordUsage(now time.Time, u provider.Usage, cost float64) {
	s.lock()
	defer s.mu.Unlock()
	l := &s.ledger
	l.total.add(u, cost)
	m := now.Unix() / 60
	i := m % 60
	if l.minuteOf[i] != m {
		l.minutes[i], l.minuteOf[i] = Spend{}, m
	}
	l.minutes[i].add(u, cost)
}

// RecordFailover counts an attempt on the deployment that failed with
// class and was failed over from.
func (s *State) RecordFailover(class provider.Class) {
	s.lock()
	defer s.mu.Unlock()
	if int(class) < len(s.ledger.failovers) {
		s.ledger.failovers[class]++
	}
}

// Usage reports the spend as of now.
func (s *State) Usage(now time.Time) UsageReport {
	s.lock()
	defer s.mu.Unlock()
	l := &s.ledger
	r := UsageReport{Total: l.total, Failovers: map[string]int64{}}
	m := now.Unix() / 60
	for i := range l.minutes {
		if m-l.minuteOf[i] < 60 && l.minuteOf[i] <= m {
			r.LastHour.plus(l.minutes[i])
		}
	}
	for c, n := range l.failovers {
		if n > 0 {
			r.Failovers[provider.Class(c).String()] = n
		}
	}
	return r
}
