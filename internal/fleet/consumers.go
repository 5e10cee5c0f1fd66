package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// Consumers' limits across the fleet. A consumer's rpm and tpm are one
// sliding minute for the whole fleet, counted as a deployment's declared
// limits are (declared.go, declaredScript): in Redis under
// <prefix>{c:<hash of the consumer's name>}:declared (and
// :declared_tokens), the instances granted places in it that they use
// within declaredUse, sized from each one's demand for that consumer. So a
// request costs no Redis call while the instance's grant holds its place
// (the next grant is asked for in the background), and the instances
// together never admit more than the rpm (or tpm) in any minute: a grant
// counts from when it is made until a minute after its use ends.

// maxConsumerBindings bounds the consumers whose grants a store keeps:
// beyond it, those holding no grant are forgotten (the next request of one
// asks Redis again, as after a minute idle).
const maxConsumerBindings = 10000

// ConsumerID names a consumer in keys: a hash of its name, so that no key
// shows it.
func ConsumerID(name string) string {
	sum := sha256.Sum256([]byte("llm_router consumer\x00" + name))
	return hex.EncodeToString(sum[:16])
}

// ReserveConsumer implements consumer.Fleet: a place for one request of
// tokens in the fleet's minute of consumer name's rpm requests and tpm
// tokens (0: not limited), from this instance's grants while they hold it
// (no Redis call), else from a new grant within the store's timeout. A
// wait is until the fleet's minute has room, by Redis' clock (a grant
// counts until a minute after its use can end, so up to declaredUse more
// than a minute after the last request admitted). An error (the store
// down, or no answer within its timeout) leaves the decision to the
// caller's local counts.
func (s *Store) ReserveConsumer(name string, rpm, tpm, tokens int64) (time.Duration, consumer.Limit, error) {
	if rpm <= 0 && tpm <= 0 {
		return 0, "", nil
	}
	b := s.consumerBinding(name)
	b.declaredLimits(rpm, tpm)
	wait, full, err := b.reserve(rpm, tpm, tokens)
	switch {
	case err != nil:
		return 0, "", err
	case wait <= 0:
		return 0, "", nil
	case full == limitTokens:
		return wait, consumer.LimitTPM, nil
	}
	return wait, consumer.LimitRPM, nil
}

// consumerBinding returns the binding of consumer name's fleet-wide
// minute, made on first use.
func (s *Store) consumerBinding(name string) *binding {
	id := ConsumerID(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.consumers[id]; b != nil {
		return b
	}
	if s.consumers == nil {
		s.consumers = map[string]*binding{}
	}
	if len(s.consumers) >= maxConsumerBindings {
		for k, b := range s.consumers {
			if b.places.idle() {
				delete(s.consumers, k)
			}
		}
	}
	base := s.prefix + "{c:" + id + "}:"
	b := &binding{s: s, id: id, logKey: base + "declared", tokensKey: base + "declared_tokens"}
	s.consumers[id] = b
	return b
}

// snapshotConsumers returns the consumers' bindings.
func (s *Store) snapshotConsumers() []*binding {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*binding, 0, len(s.consumers))
	for _, b := range s.consumers {
		out = append(out, b)
	}
	return out
}

// idle reports whether p holds no grant and no call is in flight.
func (p *places) idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.grants) == 0 && p.flight == nil
}

// Interface guards
var _ consumer.Fleet = (*Store)(nil)
