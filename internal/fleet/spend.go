package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// Budgets' spending, shared by the fleet (capacity.SpendStore): one
// float per scope and window, what the fleet spent and holds (attempts'
// worst-case costs, held before they are sent), added to with
// addScript (INCRBYFLOAT once per write: a hold given back is a negative
// amount) or, for a hold, by holdScript only while it fits; it expires
// after its window, with the hash of the writes applied to it
// (spentKey), which makes a retried write count once. A hold of
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

// spentKey is the key of a spending's writes applied (a hash: each
// writer's last Seq), in the spending's hash slot (Redis Cluster hashes
// a key's first non-empty {tag}, else the whole key).
func spentKey(spendKey string) string {
	if open := strings.IndexByte(spendKey, '{'); open >= 0 {
		if end := strings.IndexByte(spendKey[open+1:], '}'); end > 0 {
			return spendKey + ":applied" // its tag places both
		}
	}
	return "{" + spendKey + "}:applied"
}

// luaTotal is the scripts' reading of a budget's total (total_of): a key
// of another type, or a value that is no finite number (a stray or
// hostile value: "abc", "nan", "inf"), is deleted and read as 0, as none
// would be, so that no script fails on it and INCRBYFLOAT can add to it;
// and its version (bump): each script that changes the total counts it in
// the writes applied ("#v"), so that a carry that read the total knows
// whether a later one read it since (CarrySpend).
const luaTotal = `
local function total_of(key)
  local t = redis.call('TYPE', key).ok
  if t ~= 'string' then
    if t ~= 'none' then
      redis.call('DEL', key)
    end
    return 0
  end
  local n = tonumber(redis.call('GET', key))
  if not n or n ~= n or n == math.huge or n == -math.huge then
    redis.call('DEL', key)
    return 0
  end
  return n
end
local function bump(applied, ttl)
  local t = redis.call('TYPE', applied).ok
  if t ~= 'hash' and t ~= 'none' then
    redis.call('DEL', applied)
  end
  redis.call('HINCRBY', applied, '#v', 1)
  redis.call('PEXPIRE', applied, ttl)
end
`

// addScript adds a write to a budget's total unless it was applied
// already (a retry whose first reply was lost): each writer's writes
// come in order, so a Seq at most its last one applied was. A write that
// records (ARGV[5] "1": a leasing writer's, capacity.SpendOp.Record)
// sets the writer's entries in the slices hash as leaseSpendScript does,
// so that a slice given back leaves no record of it behind.
//
//	KEYS[1]  the total, KEYS[2] the writes applied (writer -> last Seq),
//	KEYS[3]  the slices (leaseSpendScript's)
//	ARGV[1]  the amount (USD), ARGV[2] the writer, ARGV[3] its Seq, ARGV[4] ttl (ms),
//	ARGV[5]  "1" to record, ARGV[6] the writer's slice, ARGV[7] its holds
//	in flight (USD), ARGV[8] the entries' ttl (ms)
//
// It returns the total as a string.
var addScript = redis.NewScript(luaTotal + `
if redis.call('TYPE', KEYS[2]).ok ~= 'hash' then
  redis.call('DEL', KEYS[2])
end
local cur = total_of(KEYS[1])
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0') or 0
if tonumber(ARGV[3]) <= last then
  return tostring(cur)
end
local n = redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
bump(KEYS[2], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if ARGV[5] == '1' then
  if redis.call('TYPE', KEYS[3]).ok ~= 'hash' then
    redis.call('DEL', KEYS[3])
  end
  local t = redis.call('TIME')
  local exp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[8])
  for i, f in ipairs({ARGV[2], ARGV[2] .. '#held'}) do
    local m = tonumber(ARGV[5 + i]) or 0
    if m > 0 then
      redis.call('HSET', KEYS[3], f, string.format('%.17g', m) .. ':' .. exp)
    else
      redis.call('HDEL', KEYS[3], f)
    end
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
end
return n
`)

// AddSpend adds usd to key's total, which expires after ttl, once per op
// (a retried op is not added again), and returns the total;
// ErrUnavailable when the store is down.
func (s *Store) AddSpend(ctx context.Context, key string, usd float64, op capacity.SpendOp, ttl time.Duration) (float64, error) {
	if !s.available() {
		return 0, ErrUnavailable
	}
	start := time.Now()
	ctx, cancel := s.requestCtx(ctx)
	defer cancel()
	record := "0"
	if op.Record {
		record = "1"
	}
	f := func(v float64) string { return strconv.FormatFloat(max(v, 0), 'g', -1, 64) }
	return s.runTotal(ctx, start, addScript, "add", key, strconv.FormatFloat(usd, 'g', -1, 64), op.Writer, op.Seq, ttl.Milliseconds(),
		record, f(op.Slice), f(op.InFlight), max(op.EntryTTL.Milliseconds(), 1))
}

// runTotal runs script (the add or carry script, named name) on key's
// total and its spent log with args, and returns the total it answers;
// a failed call is recorded as the request path's (callFailed).
func (s *Store) runTotal(ctx context.Context, start time.Time, script *redis.Script, name, key string, args ...any) (float64, error) {
	k := s.spendKey(key)
	str, err := script.Run(ctx, s.client, []string{k, spentKey(k), slicesKey(k)}, args...).Text()
	if err != nil {
		s.callFailed("spend", err, start)
		return 0, err
	}
	s.answered()
	total, err := strconv.ParseFloat(str, 64)
	if err != nil {
		s.obs.Error("spend")
		return 0, fmt.Errorf("spend: the %s script's total %q: %w", name, str, err)
	}
	return total, nil
}

// holdScript adds a hold to a budget's total only if the total stays
// within the limit, atomically (the fleet's holds never promise the
// budget twice).
//
//	KEYS[1]  the total, KEYS[2] the writes applied (its version)
//	ARGV[1]  the hold (USD), ARGV[2] the limit (USD), ARGV[3] ttl (ms)
//
// It returns {1, new total} when it held, else {0, total}; the totals as
// strings (Redis' replies truncate Lua numbers to integers).
var holdScript = redis.NewScript(luaTotal + `
local total = total_of(KEYS[1])
if total + tonumber(ARGV[1]) > tonumber(ARGV[2]) then
  return {0, tostring(total)}
end
local n = redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
bump(KEYS[2], ARGV[3])
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
	k := s.spendKey(key)
	res, err := holdScript.Run(ctx, s.client, []string{k, spentKey(k)},
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

// carryScript carries a window's total into another's (a budget's
// period changed: capacity.SpendCarrier): it adds to the total what the
// old window's total (read by the caller) has beyond what was carried
// from it before, and keeps that in the writes applied, so that each
// instance's carry adds only what the fleet spent since the last one
// (the instances reload one by one, the later ones still spending in
// the old window until then). A read of the old window's total made
// after the last one carried (its version, the old window's "#v", is
// larger) decides whatever it says: a total that went down since (a
// slice given back there, by an instance stopping or reloading later,
// after an earlier carry counted it as spent) takes back from this one;
// an older read, or one of no version, adds only what it has beyond the
// last carried. The first carry from a window adds its amount whatever
// its sign: a window carried
// back into the one it was carried from (a period changed there and
// back) has, less what it holds carried from there, what it spent less
// what slices of there it was given at the reload (CarrySpend), which
// may be less than 0: those slices are in there's total still, counted
// once as spent and once given back. The total never goes below 0. A
// total that is not a number is replaced by 0 as none would be.
//
//	KEYS[1]  the total, KEYS[2] the writes applied
//	ARGV[1]  the field of the old window, ARGV[2] its amount (USD), ARGV[3] ttl (ms),
//	ARGV[4]  the version of the old window's total read (0: none)
//
// It returns the total as a string.
var carryScript = redis.NewScript(luaTotal + `
total_of(KEYS[1])
if redis.call('TYPE', KEYS[2]).ok ~= 'hash' then
  redis.call('DEL', KEYS[2])
end
local o = tonumber(ARGV[2]) or 0
local c = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '')
local v = tonumber(ARGV[4]) or 0
local cv = tonumber(redis.call('HGET', KEYS[2], 'v:' .. ARGV[1]) or '')
if v > 0 and (cv == nil or v > cv) then
  redis.call('HSET', KEYS[2], 'v:' .. ARGV[1], tostring(v))
end
local apply, n
if c == nil then
  apply = o ~= 0
elseif v > 0 and cv ~= nil then
  apply = v > cv and o ~= c -- the later read decides, whatever its sign
else
  apply = o > c -- reads of no version: the largest decides
end
if apply then
  n = redis.call('INCRBYFLOAT', KEYS[1], string.format('%.17g', o - (c or 0)))
  if tonumber(n) < 0 then
    redis.call('SET', KEYS[1], '0')
    n = '0'
  end
  redis.call('HSET', KEYS[2], ARGV[1], string.format('%.17g', o))
  bump(KEYS[2], ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  n = tostring(total_of(KEYS[1]))
end
return n
`)

// CarrySpend adds to key's total (which expires after ttl) what from's
// total has beyond what was carried from it before, once per amount
// however many instances carry it (capacity.SpendCarrier), and returns
// key's total; ErrUnavailable when the store is down. from's total is
// read first, then carried (the two keys may be in different hash slots
// of a cluster): a carry that read less than an earlier one adds nothing.
// What from's total holds carried from key (a period changed there and
// back, within both windows) is not carried back: it is in key already.
func (s *Store) CarrySpend(ctx context.Context, from, key string, ttl time.Duration) (float64, error) {
	if !s.available() {
		return 0, ErrUnavailable
	}
	start := time.Now()
	ctx, cancel := s.requestCtx(ctx)
	defer cancel()
	f, k := s.spendKey(from), s.spendKey(key)
	pipe := s.client.Pipeline()
	get, back, version := pipe.Get(ctx, f), pipe.HGet(ctx, spentKey(f), "carry:"+k), pipe.HGet(ctx, spentKey(f), "#v") // from's slot, all
	_, _ = pipe.Exec(ctx)                                                                                              // each command's error below
	for _, c := range []redis.Cmder{get, back, version} {
		var reply redis.Error
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) && !errors.As(err, &reply) { // a value of another type (WRONGTYPE) is none
			s.callFailed("spend", err, start)
			return 0, err
		}
	}
	old, err := get.Float64()
	if err != nil || !(old >= 0) || math.IsInf(old, 0) {
		old = 0 // none, or not a number: none, as the scripts take it (and nothing carried from key is taken back)
	} else if in, err := back.Float64(); err == nil && in != 0 {
		old -= in // what from holds carried from key, whatever its sign (a carry back may have taken from it); old may be less than 0: what key's slices gave back to from at a reload to from's period is in key's total still
	}
	v, _ := version.Int64() // 0: none (written before versions), the largest read decides
	return s.runTotal(ctx, start, carryScript, "carry", key, "carry:"+f, strconv.FormatFloat(old, 'g', -1, 64), ttl.Milliseconds(), max(v, 0))
}

// periodsScript records a budget's period as in use (capacity.SpendCarrier's
// SpendPeriods) and answers the others recorded and not expired, each
// with how long ago it was recorded (ms; -1 for an entry of the shape
// before: unknown).
//
//	KEYS[1]  the budget's periods (a hash: period -> "<expiry>:<recorded>",
//	Unix ms on Redis' clock)
//	ARGV[1]  the period (Go's duration string), ARGV[2] its ttl (ms)
//
// An entry of another shape, or past its expiry, is dropped; the hash
// expires with its longest entry.
var periodsScript = redis.NewScript(`
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  redis.call('DEL', KEYS[1])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local out, last = {}, now + ttl
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local e, at = string.match(all[i + 1], '^(%d+):(%d+)$')
  if not e then
    e, at = string.match(all[i + 1], '^(%d+)$'), nil
  end
  e, at = tonumber(e), tonumber(at)
  if not e or e <= now or e > now + 400 * 86400000 or not string.match(all[i], '^[%dhms%.]+$') then
    redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] ~= ARGV[1] then
    local age = -1
    if at and at <= now then
      age = now - at
    end
    out[#out + 1] = all[i]
    out[#out + 1] = tostring(age)
    if e > last then last = e end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], tostring(now + ttl) .. ':' .. tostring(now))
redis.call('PEXPIREAT', KEYS[1], last)
return out
`)

// maxCarriedPeriod bounds a recorded period the store answers: no budget
// period is longer than a year (a longer or malformed one is not a
// router's).
const maxCarriedPeriod = 366 * 24 * time.Hour

// SpendPeriods records per as a period of base's budget in use, for ttl,
// and returns the other periods recorded and not expired
// (capacity.SpendCarrier); ErrUnavailable when the store is down.
func (s *Store) SpendPeriods(ctx context.Context, base string, per, ttl time.Duration) ([]capacity.PeriodInUse, error) {
	if !s.available() {
		return nil, ErrUnavailable
	}
	start := time.Now()
	ctx, cancel := s.requestCtx(ctx)
	defer cancel()
	fields, err := periodsScript.Run(ctx, s.client, []string{s.spendKey(base + ":periods")}, per.String(), max(ttl.Milliseconds(), 1)).StringSlice()
	if err != nil {
		s.callFailed("spend", err, start)
		return nil, err
	}
	s.answered()
	var out []capacity.PeriodInUse
	for i := 0; i+1 < len(fields); i += 2 {
		d, err := time.ParseDuration(fields[i])
		age, err2 := strconv.ParseInt(fields[i+1], 10, 64)
		if err == nil && err2 == nil && d > 0 && d <= maxCarriedPeriod && d != per {
			out = append(out, capacity.PeriodInUse{Period: d, Age: time.Duration(age) * time.Millisecond})
		}
	}
	return out, nil
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
	var reply redis.Error
	var num *strconv.NumError
	switch {
	case errors.Is(err, redis.Nil), errors.As(err, &num), err == nil && (math.IsNaN(v) || math.IsInf(v, 0)):
		return 0, nil // none, or no finite number: none, as the scripts take it
	case errors.As(err, &reply):
		return 0, nil // a key of another type: none, as the scripts take it
	case err != nil:
		s.callFailed("spend", err, start)
	}
	return v, err
}

// leaseSpendScript leases a slice of a budget: it adds to the total need
// and, up to ask, half of what the limit leaves beyond need and keep (the
// rest of the fleet leases the other half, and an attempt of keep, one as
// large as this instance's, fits on another instance: a budget near its
// end is leased an attempt at a time), and nothing when need does not fit. A total that is not a number (a hostile
// or stray value) is replaced by 0 as none would be.
//
// It keeps, in the slices hash, each instance's slice as that instance
// last stated it (what it held unspent, with this grant), as
// "<USD>:<expiry, Unix ms on Redis' clock>", and answers what the other
// instances' entries not yet expired add up to: what of the total may
// still come back to the budget (an instance's slice is given back, or
// spent, within spendLeaseIdle; an entry that is not renewed counts no
// more after its ttl). Beside it, under "<writer>#held" in the same
// shape, it keeps what the instance's holds in flight hold (they settle
// at their answers' cost, no more), and answers the others' sum of those
// apart. An entry of another shape is dropped.
//
//	KEYS[1]  the total, KEYS[2] the slices, KEYS[3] the writes applied (its version)
//	ARGV[1]  need, ARGV[2] ask, ARGV[3] the limit, ARGV[5] keep (USD),
//	ARGV[4] ttl (ms), ARGV[6] the writer, ARGV[7] its slice before this
//	grant (USD), ARGV[8] its entry's ttl (ms), ARGV[9] its holds in
//	flight (USD)
//
// It returns {slice granted, total, the others' slices, the others'
// holds}, as strings (Redis' replies truncate Lua numbers to integers).
var leaseSpendScript = redis.NewScript(luaTotal + `
local total = total_of(KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local others, held = 0, 0
if redis.call('TYPE', KEYS[2]).ok ~= 'hash' then
  redis.call('DEL', KEYS[2])
end
local heldField = ARGV[6] .. '#held'
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local a, e = string.match(all[i + 1], '^([%d%.eE%+%-]+):(%d+)$')
  a, e = tonumber(a), tonumber(e)
  if not a or not e or e <= now or a < 0 or e > now + tonumber(ARGV[8]) then
    redis.call('HDEL', KEYS[2], all[i])
  elseif all[i] ~= ARGV[6] and all[i] ~= heldField then
    if string.sub(all[i], -5) == '#held' then
      held = held + a
    else
      others = others + a
    end
  end
end
local function entry(field, m)
  if m > 0 then
    redis.call('HSET', KEYS[2], field, string.format('%.17g', m) .. ':' .. (now + tonumber(ARGV[8])))
  else
    redis.call('HDEL', KEYS[2], field)
  end
end
local function mine(g)
  entry(ARGV[6], tonumber(ARGV[7]) + g)
  entry(heldField, tonumber(ARGV[9]) or 0)
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
local need, ask, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local room = limit - total
if room <= 0 or need > room then
  mine(0)
  return {'0', tostring(total), tostring(others), tostring(held)}
end
local g = need + math.max(math.min(ask - need, (room - need - tonumber(ARGV[5])) / 2), 0)
if g <= 0 then
  mine(0)
  return {'0', tostring(total), tostring(others), tostring(held)}
end
local gs = string.format('%.17g', g)
local n = redis.call('INCRBYFLOAT', KEYS[1], gs)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
bump(KEYS[3], ARGV[4])
mine(tonumber(gs))
return {gs, n, tostring(others), tostring(held)}
`)

// slicesKey is the key of a spending's slices (leaseSpendScript), in
// the spending's hash slot, as spentKey.
func slicesKey(spendKey string) string {
	return strings.TrimSuffix(spentKey(spendKey), ":applied") + ":slices"
}

// LeaseSpend leases a slice of key's budget (capacity.SpendLeaser): it
// adds to the total, which expires after ttl, need and, up to ask (USD),
// half of what limit leaves beyond need and keep, and nothing when need
// does not fit; it returns the slice, the total and what the other
// instances' slices held unspent as they last stated it. It records
// writer's slice, held (USD) before the grant, for entryTTL.
// ErrUnavailable when the store is down. It is bounded by Timeout.
func (s *Store) LeaseSpend(ctx context.Context, l capacity.SpendLease) (capacity.SpendGrant, error) {
	if !s.available() {
		return capacity.SpendGrant{}, ErrUnavailable
	}
	start := time.Now()
	ctx, cancel := s.requestCtx(ctx)
	defer cancel()
	k := s.spendKey(l.Key)
	f := func(v float64) string { return strconv.FormatFloat(max(v, 0), 'g', -1, 64) }
	res, err := leaseSpendScript.Run(ctx, s.client, []string{k, slicesKey(k), spentKey(k)}, f(l.Need), f(max(l.Ask, l.Need)),
		strconv.FormatFloat(l.Limit, 'g', -1, 64), l.TTL.Milliseconds(), f(l.Keep), l.Writer, f(l.Held),
		max(l.EntryTTL.Milliseconds(), 1), f(l.InFlight)).StringSlice()
	if err != nil {
		s.callFailed("spend", err, start)
		return capacity.SpendGrant{}, err
	}
	s.answered()
	if len(res) != 4 {
		s.obs.Error("spend")
		return capacity.SpendGrant{}, errors.New("spend: the lease script answered " + fmt.Sprint(res))
	}
	granted, err1 := strconv.ParseFloat(res[0], 64)
	total, err2 := strconv.ParseFloat(res[1], 64)
	others, err3 := strconv.ParseFloat(res[2], 64)
	held, err4 := strconv.ParseFloat(res[3], 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		s.obs.Error("spend")
		return capacity.SpendGrant{}, fmt.Errorf("spend: the lease script's reply %q: %w", res, err)
	}
	return capacity.SpendGrant{Granted: granted, Total: total, Others: others, OthersInFlight: held}, nil
}

// maxTrackedSpendings bounds the budgets a store tracks for Close: beyond
// it, those whose slice holds nothing are forgotten (one that leases
// again is tracked again).
const maxTrackedSpendings = 20000

// TrackSpending implements capacity.SpendTracker: sp leased a slice, and
// Close gives back what it holds then (Spending.Release), so that a
// gracefully stopped instance leaves none of a budget's slices counted as
// spent until their windows end.
func (s *Store) TrackSpending(sp *capacity.Spending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.spendings == nil {
		s.spendings = map[*capacity.Spending]bool{}
	}
	if len(s.spendings) >= maxTrackedSpendings {
		for t := range s.spendings {
			if t.Slice() == 0 {
				delete(s.spendings, t)
			}
		}
	}
	s.spendings[sp] = true
}
