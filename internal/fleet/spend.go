package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Budgets' spending, shared by the fleet (capacity.SpendStore): one
// float per scope and window, added to with INCRBYFLOAT, expiring after
// its window.

// spendKey is the key of a spending (its scope and window, hashed: a
// deployment's identity names its account).
func (s *Store) spendKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return s.prefix + "spend:" + hex.EncodeToString(sum[:12])
}

// AddSpend adds usd to key's total, which expires after ttl, and returns
// the new total; ErrUnavailable when the store is down.
func (s *Store) AddSpend(ctx context.Context, key string, usd float64, ttl time.Duration) (float64, error) {
	if !s.available() {
		return 0, ErrUnavailable
	}
	k := s.spendKey(key)
	pipe := s.client.TxPipeline()
	total := pipe.IncrByFloat(ctx, k, usd)
	pipe.PExpire(ctx, k, ttl)
	if _, err := pipe.Exec(ctx); err != nil {
		s.obs.Error("spend")
		return 0, err
	}
	return total.Val(), nil
}

// Spend returns key's total, 0 when there is none.
func (s *Store) Spend(ctx context.Context, key string) (float64, error) {
	if !s.available() {
		return 0, ErrUnavailable
	}
	v, err := s.client.Get(ctx, s.spendKey(key)).Float64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		s.obs.Error("spend")
	}
	return v, err
}
