package consumer

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/period"
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
	window   int64         // the budget window's index (Unix ns / per)
	per      time.Duration // the period window counts in (0: none yet)
	spent    float64
	// held is what the requests in flight hold of the budget (their worst
	// cases, USD), until each is done.
	held float64
	// flying are the admission instants of the requests in flight, and
	// took a moving average of how long its requests took from admission
	// to done (0: none done yet): when one in flight is expected to end.
	flying []time.Time
	took   time.Duration
}

// admit counts a request of tokens at now that holds hold USD of the
// budget (its worst case), or returns the refusal (and counts nothing).
// Of several limits over, the refusal is the one that admits the request
// last, so that its RetryAfter is the whole wait; a wait no instant tells
// (a concurrent slot, a budget held by requests in flight) is when the
// first in flight is expected to end (endsAt), none when unknown.
func (u *usage) admit(now time.Time, tokens int64, hold float64) *Refusal {
	var ref *Refusal
	refuse := func(l Limit, until time.Time, msg string) {
		wait := time.Duration(0) // unknown
		if !until.IsZero() {
			wait = max(until.Sub(now), time.Second)
		}
		if ref == nil || wait > ref.RetryAfter {
			ref = &Refusal{Status: http.StatusTooManyRequests, Limit: l, RetryAfter: wait, Message: msg}
		}
	}
	p := u.plan
	if p.BudgetUSD > 0 {
		u.roll(now)
		if end := time.Unix(0, (u.window+1)*int64(p.BudgetPer)); u.spent >= p.BudgetUSD {
			refuse(LimitBudget, end, fmt.Sprintf("%.4g of %.4g USD per %s spent; it renews at %s", u.spent, p.BudgetUSD, period.String(p.BudgetPer), end.UTC().Format(time.RFC3339)))
		} else if u.spent+u.held >= p.BudgetUSD {
			refuse(LimitBudget, u.endsAt(now), fmt.Sprintf("%.4g of %.4g USD per %s spent and %.4g held by its %d requests in flight (their worst cases, until they are answered)", u.spent, p.BudgetUSD, period.String(p.BudgetPer), u.held, u.inFlight))
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
		refuse(LimitConcurrent, u.endsAt(now), fmt.Sprintf("%d requests in flight, concurrent %d", u.inFlight, p.Concurrent))
	}
	if ref != nil {
		return ref
	}
	u.requests.add(now, 1)
	u.tokens.add(now, tokens)
	u.inFlight++
	u.held += hold
	u.flying = append(u.flying, now)
	return nil
}

// endsAt is when the first of u's requests in flight is expected to end:
// its admission plus took, a second from now at the earliest (one is
// overdue: soon); zero when unknown (none done yet, or none in flight).
func (u *usage) endsAt(now time.Time) time.Time {
	if u.took <= 0 || len(u.flying) == 0 {
		return time.Time{}
	}
	return maxTime(slices.MinFunc(u.flying, time.Time.Compare).Add(u.took), now.Add(time.Second))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// land takes a request admitted at start, holding hold, out of those in
// flight, under c.mu.
func (u *usage) land(start time.Time, hold float64) {
	u.inFlight--
	if i := slices.IndexFunc(u.flying, start.Equal); i >= 0 {
		u.flying = slices.Delete(u.flying, i, i+1)
	}
	if u.held -= hold; u.inFlight <= 0 || u.held < 0 {
		u.held = 0 // no float residue once nothing is held
	}
}

// undo takes back what admit counted at now for a request of tokens
// holding hold.
func (u *usage) undo(now time.Time, tokens int64, hold float64) {
	u.requests.add(now, -1)
	u.tokens.add(now, -tokens)
	u.land(now, hold)
}

// roll moves the budget to now's window. A plan whose period changed (a
// reload) carries what the window counted in the old period spent into
// the new period's window of now, unless the old window has ended: a
// reload forgives nothing.
func (u *usage) roll(now time.Time) {
	per := u.plan.BudgetPer
	if per <= 0 {
		return
	}
	i := now.UnixNano() / int64(per)
	if per != u.per {
		if u.per > 0 && now.UnixNano()/int64(u.per) != u.window {
			u.spent = 0
		}
		u.window, u.per = i, per
		return
	}
	if i != u.window {
		u.window, u.spent = i, 0
	}
}

// tookWeight is the weight of a request's duration in usage.took's
// moving average.
const tookWeight = 0.25

// done ends at now a request admitted at start, holding hold, that cost
// usd: its hold is settled at usd.
func (u *usage) done(now, start time.Time, hold, usd float64) {
	u.c.mu.Lock()
	defer u.c.mu.Unlock()
	u.land(start, hold)
	switch d := now.Sub(start); {
	case d <= 0: // no time the clock can tell
	case u.took <= 0:
		u.took = d
	default:
		u.took += time.Duration(tookWeight * float64(d-u.took))
	}
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
		out.SpentUSD, out.HeldUSD, out.BudgetPer = u.spent, u.held, period.String(p.BudgetPer)
	}
	return out
}
