package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// Consumers' limits across the fleet. A consumer's rpm and tpm are one
// sliding minute for the whole fleet, counted as a deployment's declared
// limits are (declared.go, declaredScript): in Redis under
// <prefix>{c:<hash of the consumer's and its plan's names>}:declared (and
// :declared_tokens: one minute per consumer and plan, so that two
// llm_router blocks sharing a store that put a consumer on plans of
// different names count it apart, as each counts it on its own), the instances granted places in it that they use
// within declaredUse, sized from each one's demand for that consumer. So a
// request costs no Redis call while the instance's grant holds its place
// (the next grant is asked for in the background), and the instances
// together never admit more than the rpm (or tpm) in any minute: a grant
// counts from when it is made until a minute after its use ends.

// maxConsumerBindings bounds the consumers whose grants a store keeps:
// beyond it, those holding no grant are forgotten (the next request of one
// asks Redis again, as after a minute idle).
const maxConsumerBindings = 10000

// consumerID names a consumer on a plan in keys: a hash of their names,
// so that no key shows them.
func consumerID(name, plan string) string {
	sum := sha256.Sum256([]byte("llm_router consumer\x00" + name + "\x00" + plan))
	return hex.EncodeToString(sum[:16])
}

// consumerRecheck bounds how long an instance answers a consumer's
// requests with the fleet's last refusal before it asks Redis again: a
// consumer over its limit costs a Redis call a second per instance, not one
// per request (places given back meanwhile are seen at the next one).
const consumerRecheck = time.Second

// consumerLimits is one consumer's fleet-wide minute on this instance.
type consumerLimits struct {
	b       *binding // its grants of places (declared.go), without a State
	mu      sync.Mutex
	until   time.Time // the fleet's last refusal: its minute has room then
	recheck time.Time // ask Redis again from then
	limit   consumer.Limit
}

// refused returns the fleet's last refusal while it stands at now.
func (c *consumerLimits) refused(now time.Time) (time.Duration, consumer.Limit, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !now.Before(c.recheck) {
		return 0, "", false
	}
	return c.until.Sub(now), c.limit, true
}

// ReserveConsumer implements consumer.Fleet: a place for one request of
// tokens in the fleet's minute of consumer name on plan, of rpm requests
// and tpm tokens (0: not limited), from this instance's grants while they hold it
// (no Redis call), else from a new grant within the store's timeout. A
// wait is until the fleet's minute has room, by Redis' clock (a grant
// counts until a minute after its use can end, so up to declaredUse more
// than a minute after the last request admitted); a refusal stands for
// consumerRecheck on this instance. An error (the store down, or no answer
// within its timeout) leaves the decision to the caller's local counts.
func (s *Store) ReserveConsumer(name, plan string, rpm, tpm, tokens int64) (time.Duration, consumer.Limit, error) {
	if rpm <= 0 && tpm <= 0 {
		return 0, "", nil
	}
	c := s.consumerLimits(name, plan)
	if wait, l, ok := c.refused(time.Now()); ok {
		return max(wait, time.Millisecond), l, nil
	}
	c.b.declaredLimits(rpm, tpm)
	wait, full, err := c.b.reserve(rpm, tpm, tokens)
	if err != nil || wait <= 0 {
		return 0, "", err
	}
	l := consumer.LimitRPM
	if full == limitTokens {
		l = consumer.LimitTPM
	}
	c.refuse(time.Now(), wait, l)
	return wait, l, nil
}

// refuse keeps a refusal at now for wait, and holds the background's
// renewals of the grants until the minute has room (a renewal would find
// it spent): the next request after consumerRecheck asks instead.
func (c *consumerLimits) refuse(now time.Time, wait time.Duration, l consumer.Limit) {
	c.mu.Lock()
	c.until, c.recheck, c.limit = now.Add(wait), now.Add(min(wait, consumerRecheck)), l
	c.mu.Unlock()
	p := &c.b.places
	p.mu.Lock()
	p.full = now.Add(wait)
	p.mu.Unlock()
}

// consumerLimits returns the fleet-wide minute of consumer name on plan,
// made on first use.
func (s *Store) consumerLimits(name, plan string) *consumerLimits {
	id := consumerID(name, plan)
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.consumers[id]; c != nil {
		return c
	}
	if s.consumers == nil {
		s.consumers = map[string]*consumerLimits{}
	}
	if len(s.consumers) >= maxConsumerBindings {
		for k, c := range s.consumers {
			if c.b.places.idle() {
				delete(s.consumers, k)
			}
		}
	}
	base := s.prefix + "{c:" + id + "}:"
	c := &consumerLimits{b: &binding{s: s, id: id, logKey: base + "declared", tokensKey: base + "declared_tokens", window: s.consumerWindow}}
	s.consumers[id] = c
	return c
}

// snapshotConsumers returns the bindings of the consumers' minutes.
func (s *Store) snapshotConsumers() []*binding {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*binding, 0, len(s.consumers))
	for _, c := range s.consumers {
		out = append(out, c.b)
	}
	return out
}

// idle reports whether p holds no grant and no call is in flight.
func (p *places) idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.grants) == 0 && p.flight.done == nil
}

// Interface guards
var _ consumer.Fleet = (*Store)(nil)
