package fleet

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// binding is one deployment's link to the store: the capacity.Fleet its
// State calls.
type binding struct {
	s                                     *Store
	id                                    string
	st                                    *capacity.State
	stateKey, logKey, tokensKey, probeKey string
	budgetKey                             string

	lease  leaser // its slices of the fleet's budget (lease.go)
	places places // its grants in the declared window (declared.go)
	// late: Redis answered the last call for its slices late (over half
	// the store's timeout, or not within it while it answered others):
	// the request path waits on it no more (spendLate) until a call for
	// them answers in time.
	late atomic.Bool

	mu         sync.Mutex
	probeToken string       // the probe claim this instance holds ("" = none)
	exhausted  [2]bool      // requests, tokens: as last published
	resetAt    [2]time.Time // their resets, as last published at once
	rpm, tpm   int64        // declared, as the last attempt asked

	window time.Duration // of the declared limits: 0, capacity.DeclaredWindow (tests of consumers' set it shorter)
}

// resetMoved is how much later than the last one published at once a
// window's reset must be to go out at once again, at least (and a quarter
// of the time to it): less is a provider's rounding, or a reset stated as
// the time a bucket takes to fill, which moves with every answer.
const resetMoved = 50 * time.Millisecond

// Publish implements capacity.Fleet: it queues the parts for the writer,
// newer parts replacing older ones, and never blocks. Other instances are
// notified at once of what changes routing (a circuit, a window running out
// or coming back, a later reset); the rest (a remaining count going down)
// reaches them by polling, and is written once per PollInterval.
func (b *binding) Publish(sh capacity.Shared) {
	s := b.s
	now := time.Now()
	s.mu.Lock()
	if s.bindings[b.id] != b { // replaced or let go: its state shares nothing more
		s.mu.Unlock()
		return
	}
	p := s.pending[b]
	if p == nil {
		p = new(pending)
		s.pending[b] = p
	}
	if c := sh.Circuit; !c.At.IsZero() {
		if c.At.After(p.sh.Circuit.At) {
			p.sh.Circuit = c
		}
		p.notify = true
	}
	if d := sh.Drain; !d.At.IsZero() {
		if d.At.After(p.sh.Drain.At) {
			p.sh.Drain = d
		}
		p.notify = true
	}
	for k, w := range [2]struct {
		src capacity.SharedWindow
		dst *capacity.SharedWindow
	}{{sh.Requests, &p.sh.Requests}, {sh.Tokens, &p.sh.Tokens}} {
		if w.src.At.IsZero() {
			continue
		}
		if w.src.At.After(w.dst.At) {
			*w.dst = w.src
		}
		if ex := w.src.Exhausted(now); ex != b.exhausted[k] {
			b.exhausted[k] = ex
			p.notify = true
		}
		// A later reset (a window that started later than the fleet
		// counts it, or the next one) goes out at once too: the budget's
		// script takes the latest reset any instance learned, and a
		// window it refilled early would be spent twice at the provider.
		if moved := max(resetMoved, w.src.Reset.Sub(w.src.At)/4); w.src.Reset.After(b.resetAt[k].Add(moved)) {
			b.resetAt[k] = w.src.Reset
			p.notify = true
		}
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Spend implements capacity.Fleet from this instance's slices of the
// fleet's budget (lease.go): in memory while they hold the attempt's
// share; else it asks leaseScript for more, one call at a time per
// deployment (others wait for it), all within the store's timeout. While
// Redis cannot answer, it spends the slices it holds and no more; only
// when it holds none of a window does the instance decide on local state.
// While Redis answers late (b.late), it waits on Redis not at all
// (spendLate): an attempt waits on Redis one timeout at most for its
// decision, however often it tries again.
func (b *binding) Spend(bu capacity.Budget) (time.Duration, capacity.Budget, error) {
	s := b.s
	none := capacity.Budget{Requests: capacity.BudgetWindow{Limit: -1}, Tokens: capacity.BudgetWindow{Limit: -1}}
	start := time.Now()
	need := needs(bu)
	b.lease.want(start, need, bu)
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	for {
		now := time.Now()
		if ok, low := b.lease.take(now, need); ok {
			if low {
				s.kickLeases()
			}
			return 0, b.lease.budget(now, bu), nil
		}
		if !s.available() {
			if wait, held := b.lease.held(now, need); held {
				return max(wait, time.Millisecond), b.lease.budget(now, bu), nil // its slice only
			}
			s.obs.Fallback("spend")
			return 0, none, ErrUnavailable
		}
		if b.late.Load() {
			return b.spendLate(now, bu, need)
		}
		flight, lead := b.lease.join()
		if lead {
			return b.spendGranted(ctx, start, bu, need)
		}
		select {
		case <-flight: // the slice was renewed (or not): look again
		case <-ctx.Done():
			s.obs.Error("spend")
			b.late.Store(true) // another call waits on Redis past the timeout
			return b.spendLate(time.Now(), bu, need)
		}
	}
}

// spendLate decides an attempt without waiting on Redis, which answers
// late: from the slices (renewed in the background, bounded by the
// store's background timeout), or refused for a moment while the lease
// loop asks for the slice it lacks (the store's timeout; a second,
// within the window, when the window held no more at the last grant:
// others' slices may come back). It never spends more than the slices
// hold.
func (b *binding) spendLate(now time.Time, bu capacity.Budget, need [2]int64) (time.Duration, capacity.Budget, error) {
	if ok, low := b.lease.take(now, need); ok {
		if low {
			b.s.kickLeases()
		}
		return 0, b.lease.budget(now, bu), nil
	}
	wait := b.lease.lacking(now, need, b.s.timeout)
	b.s.kickLeases()
	return wait, b.lease.budget(now, bu), nil
}

// answeredLate records how late Redis answered a call for b's slices
// begun at called: over half the store's timeout, the request path waits
// on it no more (spendLate) until a call answers sooner.
func (b *binding) answeredLate(called time.Time) {
	b.late.Store(b.s.late(called))
}

// spendGranted asks leaseScript for what the slices lack of need, and
// spends need from what it grants.
func (b *binding) spendGranted(ctx context.Context, start time.Time, bu capacity.Budget, need [2]int64) (time.Duration, capacity.Budget, error) {
	s := b.s
	defer b.lease.land()
	none := capacity.Budget{Requests: capacity.BudgetWindow{Limit: -1}, Tokens: capacity.BudgetWindow{Limit: -1}}
	miss, ask := b.lease.asks(time.Now(), need)
	called := time.Now()
	rep, err := b.grant(ctx, bu, miss, ask, [2]int64{}, [2]int64{}, need)
	if err != nil {
		b.lease.callFailed()
		if s.busy(err, start) {
			s.obs.Error("spend")
			b.late.Store(true) // Redis is loaded, not down: decided without it
			return b.spendLate(time.Now(), bu, need)
		}
		s.fail("spend", err)
		if wait, held := b.lease.held(time.Now(), need); held {
			return max(wait, time.Millisecond), b.lease.budget(time.Now(), bu), nil // its slice only
		}
		s.obs.Fallback("spend")
		return 0, none, err
	}
	s.answered()
	b.answeredLate(called)
	ok := b.lease.applyFor(called, rep, need)
	now := time.Now()
	if !ok {
		return max(rep.wait, time.Millisecond), b.lease.budget(now, bu), nil
	}
	return 0, b.lease.budget(now, bu), nil
}

// grant runs leaseScript: need and ask per window (-1 need: not asked),
// give back what is given of the slice granted in giveReset; it states
// the slices this instance holds (beyond what it gives back, less what an
// attempt spends of them once it lands: spend, -1 none) and their
// allowances (leaser.stating).
func (b *binding) grant(ctx context.Context, bu capacity.Budget, need, ask, give, giveReset, spend [2]int64) (grantReply, error) {
	s := b.s
	args := make([]any, 0, 25)
	since := time.Since(b.lease.lastWant())
	var rates [2]float64
	for i, w := range []capacity.BudgetWindow{bu.Requests, bu.Tokens} {
		if w.Limit < 0 || need[i] < 0 {
			args = append(args, -1, 0, 0, 0, 0, 0, 0, 0)
			continue
		}
		rates[i] = w.Rate
		if w.Fixed {
			rates[i] = -1 // proved fixed: the fleet's budget holds no bucket of it (bucketLua)
		}
		// A bucket's count as the last attempt knew it, refilled since.
		rem := refilled(max(w.Remaining, 0), w.Limit, w.Rate, since)
		args = append(args, w.Limit, rem, w.Reset.UnixMilli(), max(w.Span.Milliseconds(), 1),
			need[i], max(ask[i], 0), max(give[i], 0), giveReset[i])
	}
	held, allow := b.lease.stating(time.Now(), spend, need)
	args = append(args, capacity.ResetMargin.Milliseconds(), s.origin, held[0], held[1],
		leaseEntryTTL.Milliseconds(), leaseSliceRetry.Milliseconds(), allow[0], allow[1])
	args = append(args, bucketArgs(rates)...)
	res, err := leaseScript.Run(ctx, s.client, []string{b.budgetKey, b.stateKey}, args...).Int64Slice()
	if err == nil && len(res) != 12 {
		err = errBadReply
	}
	if err != nil {
		return grantReply{}, err
	}
	return grantReply{ok: res[0] == 1, wait: time.Duration(min(res[1], provider.MaxCooldown.Milliseconds())) * time.Millisecond,
		asked: [2]bool{need[0] >= 0 && bu.Requests.Limit >= 0, need[1] >= 0 && bu.Tokens.Limit >= 0},
		left:  [2]int64{res[2], res[4]}, reset: [2]int64{res[3], res[5]}, instances: int(res[6]),
		granted: [2]int64{res[7], res[8]}, now: res[9], kept: res[10] == 1,
		bucket: [2]bool{res[11]&1 != 0, res[11]&2 != 0}}, nil
}

// ClaimProbe implements capacity.Fleet with claimScript, bounded by the
// store's timeout.
func (b *binding) ClaimProbe() (bool, error) {
	s := b.s
	if !s.available() {
		s.obs.Fallback("probe")
		return false, ErrUnavailable
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	token := s.nextToken()
	res, err := claimScript.Run(ctx, s.client, []string{b.probeKey}, token, probeTTL.Milliseconds()).Int64()
	if err != nil {
		s.fail("probe", err)
		s.obs.Fallback("probe")
		return false, err
	}
	if res == 2 {
		s.log.Warn("fleet store: malformed probe claim (no expiry, or longer than a claim may hold) bounded",
			zap.String("key", b.probeKey), zap.Duration("ttl", probeTTL))
	}
	ok := res == 1
	if ok {
		b.mu.Lock()
		b.probeToken = token
		b.mu.Unlock()
	}
	return ok, nil
}

// ReleaseProbe implements capacity.Fleet: the writer deletes the claim, if
// it is still this one.
func (b *binding) ReleaseProbe() {
	b.mu.Lock()
	token := b.probeToken
	b.probeToken = ""
	b.mu.Unlock()
	if token == "" {
		return
	}
	s := b.s
	s.mu.Lock()
	s.releases = append(s.releases, release{b.probeKey, token})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Interface guards
var _ capacity.Fleet = (*binding)(nil)
