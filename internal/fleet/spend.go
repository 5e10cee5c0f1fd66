package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Budgets' spending, shared by the fleet (capacity.SpendStore): one
// float per scope and window, what the fleet spent and holds (attempts'
// worst-case costs, held before they are sent), added to with
// INCRBYFLOAT (a hold given back: a negative amount) or, for a hold, by
// holdScript only while it fits; it expires after its window. A hold of
// an instance that died before settling it stays counted as spent until
// the window ends.

// spendKey is the key of a spending (its scope and window, hashed: a
// deployment's identity names its account).
func (s *Store) spendKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return s.prefix + "spend:" + hex.EncodeToString(sum[:12])
}

// requestCtx bounds a request-path call by the store's Timeout (and by
// ctx, when it ends sooner): the caller's own bound may be longer.
func (s *Store) requestCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// AddSpend adds usd to key's total, which expires after ttl, and returns
// the new total; ErrUnavailable when the store is down.
func (s *Store) AddSpend(ctx context.Context, key string, usd float64, ttl time.Duration) (float64, error) {
	if !s.available() {
		return 0, ErrUnavailable
	}
	start := time.Now()
	ctx, cancel := s.requestCtx(ctx)
	defer cancel()
	k := s.spendKey(key)
	pipe := s.client.TxPipeline()
	total := pipe.IncrByFloat(ctx, k, usd)
	pipe.PExpire(ctx, k, ttl)
	if _, err := pipe.Exec(ctx); err != nil {
		s.callFailed("spend", err, start)
		return 0, err
	}
	s.answered()
	return total.Val(), nil
}

// holdScript adds a hold to a budget's total only if the total stays
// within the limit, atomically (the fleet's holds never promise the
// budget twice).
//
//	KEYS[1]  the total
//	ARGV[1]  the hold (USD), ARGV[2] the limit (USD), ARGV[3] ttl (ms)
//
// It returns {1, new total} when it held, else {0, total}; the totals as
// strings (Redis' replies truncate Lua numbers to integers).
var holdScript = redis.NewScript(`
local total = tonumber(redis.call('GET', KEYS[1]) or '0')
if total + tonumber(ARGV[1]) > tonumber(ARGV[2]) then
  return {0, tostring(total)}
end
local n = redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, n}
`)

// HoldSpend adds usd to key's total, which expires after ttl, only if the
// total stays at most limit; it reports whether it did, and the total;
// ErrUnavailable when the store is down.
func (s *Store) HoldSpend(ctx context.Context, key string, usd, limit float64, ttl time.Duration) (bool, float64, error) {
	if !s.available() {
		return false, 0, ErrUnavailable
	}
	start := time.Now()
	ctx, cancel := s.requestCtx(ctx)
	defer cancel()
	res, err := holdScript.Run(ctx, s.client, []string{s.spendKey(key)},
		strconv.FormatFloat(usd, 'g', -1, 64), strconv.FormatFloat(limit, 'g', -1, 64), ttl.Milliseconds()).Slice()
	if err != nil {
		s.callFailed("spend", err, start)
		return false, 0, err
	}
	s.answered()
	if len(res) != 2 {
		s.obs.Error("spend")
		return false, 0, errors.New("spend: the hold script answered " + fmt.Sprint(res))
	}
	ok, _ := res[0].(int64)
	str, _ := res[1].(string)
	total, err := strconv.ParseFloat(str, 64)
	if err != nil {
		s.obs.Error("spend")
		return false, 0, fmt.Errorf("spend: the hold script's total %q: %w", str, err)
	}
	return ok == 1, total, nil
}

// Spend returns key's total, 0 when there is none.
func (s *Store) Spend(ctx context.Context, key string) (float64, error) {
	if !s.available() {
		return 0, ErrUnavailable
	}
	start := time.Now()
	ctx, cancel := s.requestCtx(ctx)
	defer cancel()
	v, err := s.client.Get(ctx, s.spendKey(key)).Float64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		s.callFailed("spend", err, start)
	}
	return v, err
}
