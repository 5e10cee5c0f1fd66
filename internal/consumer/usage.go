package consumer

import (
	"fmt"
	"net/http"
	"time"
)

// minute is a sliding minute in 1 s steps: what was counted in each of the
// last 60 seconds (by Unix second).
type minute struct {
	sec [60]int64 // Unix second of each slot
	n   [60]int64
}

// sum returns what was counted in the minute up to now (the 60 seconds
// that end with now's).
func (m *minute) sum(now time.Time) int64 {
	s, total := now.Unix(), int64(0)
	for i := range m.sec {
		if m.sec[i] > s-60 && m.sec[i] <= s {
			total += m.n[i]
		}
	}
	return total
}

// add counts v at now.
func (m *minute) add(now time.Time, v int64) {
	s := now.Unix()
	i := int(((s % 60) + 60) % 60)
	if m.sec[i] != s {
		m.sec[i], m.n[i] = s, 0
	}
	m.n[i] += v
}

// freeAt returns the earliest instant after now at which the minute holds
// at most limit-v, so that v more fit: the slots leave it oldest first,
// each a minute after its second began.
func (m *minute) freeAt(now time.Time, limit, v int64) time.Time {
	s := now.Unix()
	total := m.sum(now)
	for old := s - 59; old <= s; old++ {
		if total+v <= limit {
			return time.Unix(old+59, 0) // the slot before old left at its end
		}
		i := int(((old % 60) + 60) % 60)
		if m.sec[i] == old {
			total -= m.n[i]
		}
	}
	return time.Unix(s+60, 0)
}

// usage is one consumer's use of its plan's limits, under its counts'
// mutex.
type usage struct {
	c        *Counts
	plan     *Plan
	requests minute
	tokens   minute
	inFlight int
	window   int64 // the budget window's index (Unix ns / BudgetPer)
	spent    float64
}

// admit counts a request of tokens at now, or returns the refusal (and
// counts nothing). Of several limits over, the refusal is the one that
// admits the request last, so that its RetryAfter is the whole wait.
func (u *usage) admit(now time.Time, tokens int64) *Refusal {
	var ref *Refusal
	refuse := func(l Limit, until time.Time, msg string) {
		if wait := max(until.Sub(now), time.Second); ref == nil || wait > ref.RetryAfter {
			ref = &Refusal{Status: http.StatusTooManyRequests, Limit: l, RetryAfter: wait, Message: msg}
		}
	}
	p := u.plan
	if p.BudgetUSD > 0 {
		u.roll(now)
		if u.spent >= p.BudgetUSD {
			end := time.Unix(0, (u.window+1)*int64(p.BudgetPer))
			refuse(LimitBudget, end, fmt.Sprintf("%.4g of %.4g USD per %s spent; it renews at %s", u.spent, p.BudgetUSD, p.BudgetPer, end.UTC().Format(time.RFC3339)))
		}
	}
	if p.RPM > 0 && u.requests.sum(now)+1 > p.RPM {
		refuse(LimitRPM, u.requests.freeAt(now, p.RPM, 1), fmt.Sprintf("%d requests in the last minute, rpm %d", u.requests.sum(now), p.RPM))
	}
	// A request larger than the whole tpm is admitted into an empty
	// minute: it could never fit otherwise.
	if used := u.tokens.sum(now); p.TPM > 0 && used > 0 && used+tokens > p.TPM {
		refuse(LimitTPM, u.tokens.freeAt(now, p.TPM, min(tokens, p.TPM)), fmt.Sprintf("%d tokens estimated in the last minute, this request %d, tpm %d", used, tokens, p.TPM))
	}
	if p.Concurrent > 0 && u.inFlight >= p.Concurrent {
		// No instant is known: a slot frees when one of its requests ends.
		refuse(LimitConcurrent, now, fmt.Sprintf("%d requests in flight, concurrent %d", u.inFlight, p.Concurrent))
	}
	if ref != nil {
		return ref
	}
	u.requests.add(now, 1)
	u.tokens.add(now, tokens)
	u.inFlight++
	return nil
}

// undo takes back what admit counted at now for a request of tokens.
func (u *usage) undo(now time.Time, tokens int64) {
	u.requests.add(now, -1)
	u.tokens.add(now, -tokens)
	u.inFlight--
}

// roll moves the budget to now's window.
func (u *usage) roll(now time.Time) {
	if u.plan.BudgetPer <= 0 {
		return
	}
	if i := now.UnixNano() / int64(u.plan.BudgetPer); i != u.window {
		u.window, u.spent = i, 0
	}
}

// done ends a request at now that cost usd.
func (u *usage) done(now time.Time, usd float64) {
	u.c.mu.Lock()
	defer u.c.mu.Unlock()
	u.inFlight--
	u.spend(now, usd)
}

// spend adds usd to the budget window of now, under c.mu.
func (u *usage) spend(now time.Time, usd float64) {
	if usd > 0 && u.plan.BudgetUSD > 0 {
		u.roll(now)
		u.spent += usd
	}
}

// idle reports whether nothing of u's counts matters any more at now.
func (u *usage) idle(now time.Time) bool {
	if u.inFlight > 0 || u.requests.sum(now) > 0 || u.tokens.sum(now) > 0 {
		return false
	}
	if u.plan.BudgetUSD > 0 {
		u.roll(now)
		return u.spent == 0
	}
	return true
}

// report is u at now.
func (u *usage) report(consumer string, now time.Time) Usage {
	p := u.plan
	out := Usage{Consumer: consumer, Plan: p.Name, Weight: p.weight(), Requests: u.requests.sum(now), Tokens: u.tokens.sum(now),
		InFlight: u.inFlight, RPM: p.RPM, TPM: p.TPM, Concurrent: p.Concurrent, BudgetUSD: p.BudgetUSD}
	if p.BudgetUSD > 0 {
		u.roll(now)
		out.SpentUSD, out.BudgetPer = u.spent, p.BudgetPer.String()
	}
	return out
}
