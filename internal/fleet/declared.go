package fleet

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// Leased places in the declared rpm/tpm. The fleet counts a deployment's
// declared limits over one sliding minute (declaredScript's log); an
// instance does not ask for each attempt, it is granted places (requests
// and tokens) that it uses within declaredUse. A grant counts in the
// fleet's window from when it is made until a minute after its use ends,
// so that any minute holds at most the limit, whichever instance used its
// places when; what a grant did not use is given back by the next call.
// Each grant is sized from the instance's demand over declaredUse, and no
// larger than a quarter of an equal share of what the window has left
// among the instances holding grants in it; the next one is asked for in
// the background before the current one runs out or ends.
//
// While Redis cannot answer, an instance uses the places it holds, then
// decides on local state (its own declared window), as without leases: a
// declared limit is the operator's, no provider's 429 stands behind it.

// declaredUse is how long a grant of declared places may be used.
const declaredUse = 3 * time.Second

// grant is places in the declared window granted to this instance.
type grant struct {
	member                      string // in the fleet's log: "<id>:<requests>:<tokens>"
	n, used, tokens, tokensUsed int64
	until                       time.Time // local clock: the grant is used before it
}

// places holds a deployment's grants on one instance.
type places struct {
	mu               sync.Mutex
	grants           []grant // oldest first
	requests, tokens demand
	flight           inFlight  // the grant in flight
	full             time.Time // a renewal found the window spent until then
	offFrom          time.Time // the first fallback to local state of an outage (offline.go)
	report           string    // a report of it not yet confirmed
	// A consumer's minute: what the instance admitted on its own counts
	// and has not reported yet (outage.go).
	offRequests, offTokens int64
}

func (p *places) want(now time.Time, tokens int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests.add(now, 1)
	p.tokens.add(now, tokens)
}

// take uses a place of a live grant for an attempt of tokens (a limit of 0
// is not declared, and not counted), and reports whether it did and
// whether the grants run low (renew them).
func (p *places) take(now time.Time, rpm, tpm, tokens int64) (ok, low bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.grants {
		g := &p.grants[i]
		if !now.Before(g.until) || rpm > 0 && g.n-g.used < 1 || tpm > 0 && g.tokens-g.tokensUsed < tokens {
			continue
		}
		g.used++
		g.tokensUsed += tokens
		return true, p.lowLocked(now, rpm, tpm)
	}
	return false, false
}

// lowLocked reports whether the live grants hold less than leaseLowWater of
// demand, or end within it.
func (p *places) lowLocked(now time.Time, rpm, tpm int64) bool {
	var r, k int64
	end := now
	for _, g := range p.grants {
		if now.Before(g.until) {
			r, k = r+g.n-g.used, k+g.tokens-g.tokensUsed
			end = g.until
		}
	}
	return end.Sub(now) < leaseLowWater || rpm > 0 && r < p.requests.over(now, leaseLowWater) ||
		tpm > 0 && k < p.tokens.over(now, leaseLowWater)
}

// asks returns what to ask: the demand over declaredUse.
func (p *places) asks(now time.Time) (requests, tokens int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests.over(now, declaredUse), p.tokens.over(now, declaredUse)
}

// ended takes out the oldest grant whose use ended (all grants, closing),
// to give back what it did not use.
func (p *places) ended(now time.Time, closing bool) (grant, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.grants) == 0 || !closing && now.Before(p.grants[0].until) {
		return grant{}, false
	}
	g := p.grants[0]
	p.grants = p.grants[1:]
	return g, true
}

// unused returns what the live grants hold unused (requests, tokens):
// the instance's statement in the fleet's minute (declaredScript).
func (p *places) unused(now time.Time) (requests, tokens int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range p.grants {
		if now.Before(g.until) {
			requests, tokens = requests+max(g.n-g.used, 0), tokens+max(g.tokens-g.tokensUsed, 0)
		}
	}
	return requests, tokens
}

// add keeps a grant, and uses a place of it when spend.
func (p *places) add(g grant, spend bool, tokens int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if spend {
		g.used, g.tokensUsed = 1, tokens
	}
	if g.n > 0 || g.tokens > 0 {
		p.grants = append(p.grants, g)
	}
}

// demanded reports whether attempts asked lately.
func (p *places) demanded(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests.Rate(now)*capacity.DemandTau.Seconds() >= 0.5
}

// join makes the caller the one call in flight (lead), or returns the
// channel closed when that call lands.
func (p *places) join() (<-chan struct{}, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flight.join()
}

// land ends the call in flight.
func (p *places) land() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flight.land()
}

// Reserve implements capacity.Fleet from this instance's grants of places
// in the declared window: in memory while a grant holds the attempt's
// place; else it asks declaredScript for a grant, one call at a time per
// deployment (others wait for it), all within the store's timeout.
func (b *binding) Reserve(rpm, tpm, tokens int64) (time.Duration, error) {
	b.declaredLimits(rpm, tpm)
	wait, _, err := b.reserve(rpm, tpm, tokens)
	if errors.Is(err, errBusy) {
		return b.s.timeout, nil // another call waits on Redis, or Redis is loaded, not down: try again shortly
	}
	return wait, err
}

// errBusy is a reserve that found Redis loaded, not down (or another
// call on it still in flight) within the store's timeout.
var errBusy = errors.New("fleet store busy")

// reserve takes a place of b's grants for an attempt of tokens (see
// Reserve): a zero wait when it holds one, else the wait and which limit
// is full (limitRequests, limitTokens); errBusy when Redis did not answer
// in time but is up, or answers late (b.late: it is not asked on the
// request path, the lease loop renews the grants), ErrUnavailable or the
// call's error when it is down.
func (b *binding) reserve(rpm, tpm, tokens int64) (time.Duration, int64, error) {
	s := b.s
	tokens = max(tokens, 0)
	p := &b.places
	p.want(time.Now(), tokens)
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	for {
		now := time.Now()
		if ok, low := p.take(now, rpm, tpm, tokens); ok {
			if low {
				s.kickLeases()
			}
			return 0, 0, nil
		}
		if !s.available() {
			b.fallback()
			p.offline(now)
			return 0, 0, ErrUnavailable
		}
		if b.late.Load() {
			s.kickLeases() // Redis answers late: the lease loop renews the grants, no request waits on it
			return 0, 0, errBusy
		}
		flight, lead := p.join()
		if lead {
			return b.reserveGranted(ctx, rpm, tpm, tokens)
		}
		select {
		case <-flight:
		case <-ctx.Done():
			s.obs.Error(b.op())
			b.late.Store(true)
			return 0, 0, errBusy
		}
	}
}

// op names b's calls in metrics and logs: "consumer" for a consumer's
// minute, "reserve" for a deployment's declared window.
func (b *binding) op() string {
	if b.st == nil {
		return "consumer"
	}
	return "reserve"
}

// fallback counts a deployment's attempt decided on its local state; a
// consumer's minute counts its own (consumerLimits.offline: admitted or
// refused on the instance's share).
func (b *binding) fallback() {
	if b.st != nil {
		b.s.obs.Fallback("reserve")
	}
}

// declaredLimits keeps the limits the last attempt declared, for the
// background's calls.
func (b *binding) declaredLimits(rpm, tpm int64) {
	b.mu.Lock()
	b.rpm, b.tpm = rpm, tpm
	b.mu.Unlock()
}

// reserveGranted asks for a grant that holds the attempt's place, and uses
// the place (see reserve).
func (b *binding) reserveGranted(ctx context.Context, rpm, tpm, tokens int64) (time.Duration, int64, error) {
	s := b.s
	p := &b.places
	defer p.land()
	start := time.Now()
	askR, askT := p.asks(start)
	ok, wait, full, err := b.declare(ctx, rpm, tpm, 1, tokens, askR, askT+tokens, start, false)
	if err != nil {
		if s.busy(err, start) {
			s.obs.Error(b.op())
			b.late.Store(true)
			return 0, 0, errBusy
		}
		s.fail(b.op(), err)
		b.fallback()
		p.offline(start)
		return 0, 0, err
	}
	if !ok {
		return wait, full, nil
	}
	return 0, 0, nil
}

// Which declared limit a refusal found full (declaredScript's reply).
const (
	limitRequests int64 = 1
	limitTokens   int64 = 2
)

// declare runs declaredScript: it gives back the oldest grant that ended
// (all, closing), and asks for a grant (need: the attempt's place, or 0, 0
// for a renewal); the grant is kept, its place used when needed. A refusal
// says for how long, and which limit is full (limitRequests, limitTokens).
func (b *binding) declare(ctx context.Context, rpm, tpm, needR, needT, askR, askT int64, called time.Time, closing bool) (bool, time.Duration, int64, error) {
	s := b.s
	p := &b.places
	if b.st == nil {
		// What a consumer's instance admitted on its own counts enters the
		// minute before it is granted more (outage.go).
		if err := b.sendReport(ctx, b.report(called)); err != nil {
			return false, 0, 0, err
		}
	}
	back, give := p.ended(called, closing)
	member := ""
	if give {
		member = back.member
	}
	id := s.nextToken()
	unusedR, unusedT := p.unused(called)
	res, err := declaredScript.Run(ctx, s.client, []string{b.logKey, b.tokensKey},
		cmp.Or(b.window, capacity.DeclaredWindow).Milliseconds(), rpm, tpm, needR, needT, askR, askT, declaredUse.Milliseconds(),
		id, member, back.used, back.tokensUsed, b.placesRetry().Milliseconds(), unusedR, unusedT).Int64Slice()
	if err == nil && len(res) != 5 {
		err = errBadReply
	}
	if err != nil {
		return false, 0, 0, err
	}
	s.answered()
	b.answeredLate(called)
	if res[4] > 0 {
		s.log.Warn("fleet store: malformed declared-limits entries replaced (not written by this router, or by a clock that runs ahead)",
			zap.String("key", b.logKey), zap.Int64("entries", res[4]))
	}
	if res[0] != 1 {
		return false, max(time.Duration(res[1])*time.Millisecond, time.Millisecond), res[2], nil
	}
	g := grant{member: id + ":" + strconv.FormatInt(res[2], 10) + ":" + strconv.FormatInt(res[3], 10),
		n: res[2], tokens: res[3], until: called.Add(declaredUse)}
	p.add(g, needR > 0, needT)
	if res[1] > 0 {
		p.mu.Lock()
		p.full = called.Add(time.Duration(res[1]) * time.Millisecond)
		p.mu.Unlock()
	}
	return true, 0, 0, nil
}

// placesRetry is how soon a deployment's attempt refused while other
// instances' grants in use would hold it tries again (leaseSliceRetry: a
// request waits in its queue, within its deadline, for the places they
// do not use); a consumer's minute answers its client's 429 with the
// time until the minute frees (0: no retry).
func (b *binding) placesRetry() time.Duration {
	if b.st == nil {
		return 0
	}
	return leaseSliceRetry
}

// upkeepPlaces renews b's grants while attempts ask (or gives back one that
// ended), in one call, unless a request's call is in flight; closing, it
// gives back every grant.
func (b *binding) upkeepPlaces(now time.Time, closing bool) {
	p := &b.places
	b.mu.Lock()
	rpm, tpm := b.rpm, b.tpm
	b.mu.Unlock()
	if rpm <= 0 && tpm <= 0 {
		return
	}
	p.mu.Lock()
	full := now.Before(p.full)
	renew := !closing && !full && p.lowLocked(now, rpm, tpm)
	ended := len(p.grants) > 0 && (closing || !now.Before(p.grants[0].until))
	p.mu.Unlock()
	demanded := p.demanded(now)
	renew = renew && demanded
	// While attempts ask (and the window has room), a grant that ended
	// goes back with the next renewal (each call gives one back): no call
	// of its own.
	if !renew && (!ended || demanded && !closing && !full) {
		return
	}
	if _, lead := p.join(); !lead {
		return
	}
	defer p.land()
	var askR, askT int64
	if renew {
		askR, askT = p.asks(now)
	}
	ctx, cancel := b.bgContext(closing)
	defer cancel()
	for {
		if _, _, _, err := b.declare(ctx, rpm, tpm, 0, 0, askR, askT, time.Now(), closing); err != nil {
			b.s.callFailed("reserve", err, now)
			return
		}
		if !closing || p.count() == 0 {
			return
		}
	}
}

func (p *places) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.grants)
}
