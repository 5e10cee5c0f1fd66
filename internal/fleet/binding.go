package fleet

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// binding is one deployment's link to the store: the capacity.Fleet its
// State calls.
type binding struct {
	s                                     *Store
	id                                    string
	st                                    *capacity.State
	stateKey, logKey, tokensKey, probeKey string
	budgetKey                             string

	mu         sync.Mutex
	probeToken string  // the probe claim this instance holds ("" = none)
	exhausted  [2]bool // requests, tokens: as last published
}

// Publish implements capacity.Fleet: it queues the parts for the writer,
// newer parts replacing older ones, and never blocks. Other instances are
// notified at once of what changes routing (a circuit, a window running out
// or coming back); the rest (a remaining count going down) reaches them by
// polling.
func (b *binding) Publish(sh capacity.Shared) {
	s := b.s
	now := time.Now()
	s.mu.Lock()
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
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Reserve implements capacity.Fleet with reserveScript, bounded by the
// store's timeout.
func (b *binding) Reserve(rpm, tpm, tokens int64) (time.Duration, error) {
	s := b.s
	if !s.available() {
		s.obs.Fallback("reserve")
		return 0, ErrUnavailable
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	res, err := reserveScript.Run(ctx, s.client, []string{b.logKey, b.tokensKey},
		capacity.DeclaredWindow.Milliseconds(), rpm, tpm, max(tokens, 0), s.nextToken()).Int64Slice()
	if err == nil && len(res) != 3 {
		err = errBadReply
	}
	if err != nil {
		if s.busy(err, start) {
			s.obs.Error("reserve")
			return s.timeout, nil // Redis is loaded, not down: try again shortly
		}
		s.fail("reserve", err)
		s.obs.Fallback("reserve")
		return 0, err
	}
	s.answered()
	if res[2] > 0 {
		s.log.Warn("fleet store: malformed declared-limits entries replaced (not written by this router, or by a clock that runs ahead)",
			zap.String("key", b.logKey), zap.Int64("entries", res[2]))
	}
	if res[0] == 1 {
		return 0, nil
	}
	return max(time.Duration(res[1])*time.Millisecond, time.Millisecond), nil
}

// Spend implements capacity.Fleet with spendScript, bounded by the store's
// timeout.
func (b *binding) Spend(bu capacity.Budget) (time.Duration, capacity.Budget, error) {
	s := b.s
	none := capacity.Budget{Requests: capacity.BudgetWindow{Limit: -1}, Tokens: capacity.BudgetWindow{Limit: -1}}
	if !s.available() {
		s.obs.Fallback("spend")
		return 0, none, ErrUnavailable
	}
	args := make([]any, 0, 11)
	for _, w := range []capacity.BudgetWindow{bu.Requests, bu.Tokens} {
		if w.Limit < 0 {
			args = append(args, -1, 0, 0, 0, 0)
			continue
		}
		args = append(args, w.Limit, max(w.Remaining, 0), w.Reset.UnixMilli(), max(w.Span.Milliseconds(), 1), max(w.N, 0))
	}
	args = append(args, capacity.ResetMargin.Milliseconds(), s.origin)
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	res, err := spendScript.Run(ctx, s.client, []string{b.budgetKey, b.stateKey}, args...).Int64Slice()
	if err == nil && len(res) != 7 {
		err = errBadReply
	}
	if err != nil {
		if s.busy(err, start) {
			s.obs.Error("spend")
			return s.timeout, none, nil // Redis is loaded, not down: try again shortly
		}
		s.fail("spend", err)
		s.obs.Fallback("spend")
		return 0, none, err
	}
	s.answered()
	left := none
	left.Instances = int(res[6])
	if bu.Requests.Limit >= 0 {
		left.Requests = capacity.BudgetWindow{Limit: bu.Requests.Limit, Remaining: res[2], Reset: time.UnixMilli(res[3]), Span: bu.Requests.Span}
	}
	if bu.Tokens.Limit >= 0 {
		left.Tokens = capacity.BudgetWindow{Limit: bu.Tokens.Limit, Remaining: res[4], Reset: time.UnixMilli(res[5]), Span: bu.Tokens.Span}
	}
	if res[0] == 0 {
		return max(time.Duration(res[1])*time.Millisecond, time.Millisecond), left, nil
	}
	return 0, left, nil
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
