package fleet

import "time"

// Leased buckets. A window that refills continuously (a token bucket:
// Anthropic's, and an OpenAI-compatible provider's whose statements prove
// one; capacity.BudgetWindow.Rate > 0) is one budget for the fleet too,
// kept by leaseScript in the budget hash: its count at an instant (Redis'
// clock), refilled at the rate the calling instance learned, at each call
// and only there, so that the fleet spends the refill once, not once per
// instance. Slices are granted from the count and spent locally as a fixed
// window's are (lease.go), but a bucket has no window end: a slice of one
// is leased for bucketLease from the call that granted or renewed it, and
// what it holds beyond demand goes back (its units added to the count).
// The count plus the slices the instances state they hold never exceeds
// the limit (a bucket holds no more): units held in a slice while the
// provider's bucket is full are not refilled twice. An instance's count
// (the provider's statements, its own and those merged from the others)
// corrects the fleet's downward, as for a fixed window; both are counts
// in whole units (a provider floors its count), so the correction keeps
// the fraction the fleet's count refilled below the next unit (taken to
// the unit, each grant lost up to one: 155-184 served of 210 in
// TestFleetLeasesABucketAsOne).

// bucketLease is how long a slice of a bucket lasts without a renewal: as
// long as an instance's statement of its slices counts in the hash.
const bucketLease = leaseEntryTTL

// bucketLua is leaseScript's part for buckets (rates[i] > 0, units per
// ms): bucket(i, ...) reads window i's count and refills it to now, takes
// the slice given back, and returns how long an attempt that needs need
// waits (0: none); bucketWrites adds what it writes. The count is kept as
// '<n>_bucket' = "<count>:<at, Unix ms>:<rate, units per ms>" (no
// exponents: miniredis' Lua reads none), with '<n>_left' (its whole
// units) and '<n>_reset' (when it is full again) for the fixed windows'
// path. A fixed window's remainder ('<n>_left' in a window whose reset has
// not passed, no '<n>_bucket' of the same count) is the bucket's count
// now: a window proved a bucket mid-window stays the fleet's. What is no
// count, or is stamped after Redis' clock (beyond the skew), is not
// trusted: the instance's own count stands in. A refusal waits no longer
// than the caller's span (a bucket's time to fill, or the fixed window it
// takes it for).
//
//	bucket(i, limit, the instance's count, need, given back, span in ms)
var bucketLua = `
local lims, bk = {0, 0}, {}
for i = 1, 2 do
  local c, a, k = string.match(budget[names[i] .. '_bucket'] or '', '^([%d.]+):(%d+):([%d.eE+-]+)$')
  c, a, k = tonumber(c), tonumber(a), tonumber(k)
  local whole = tonumber(budget[names[i] .. '_left'] or '')
  if c and a and k and k > 0 and whole and a <= now + ` + skewMS + ` and math.floor(c) == whole then
    bk[i] = {c, math.min(a, now)}
    if rates[i] == 0 then
      rates[i] = k -- a caller that proved the window fixed (a rate below 0) does not take it
    end
  end
end
local function bucket(i, lim, lrem, need, give, span)
  local rate, mine = rates[i], ({heldR, heldT})[i]
  local r, at = -1, now
  local whole = tonumber(budget[names[i] .. '_left'] or '')
  if bk[i] then
    r, at = bk[i][1], bk[i][2]
  elseif whole and whole >= 0 and (tonumber(budget[names[i] .. '_reset'] or '0') or 0) > now then
    r = whole
  end
  if r < 0 then
    r = lrem - mine
  end
  local room = lim - others[i] - mine
  r = math.max(math.min(r + rate * (now - at), room, lrem - mine + 0.999), 0)
  if give > 0 then
    r = math.max(math.min(r + give, room), 0)
  end
  -- What a dead instance parked of its slices was not spent: it goes
  -- back to the count (its statement no longer counts in others).
  for _, p in ipairs(parked) do
    if p[2 * i - 1] > 0 then
      r = math.min(r + p[2 * i - 1], room)
    end
  end
  local lacks, w = math.max(math.min(need, lim), 1), 0
  if need > 0 and r < lacks then
    w = math.ceil((lacks - r) / rate)
    if r + others[i] >= lacks then
      w = math.min(w, retry)
    end
    w = math.max(math.min(w, span), 1)
  end
  left[i], reset[i], lims[i] = r, now + lease, lim
  return w
end
local function bucketWrites(writes, i)
  local n, c = names[i], tonumber(string.format('%.3f', left[i]))
  table.insert(writes, n .. '_bucket')
  table.insert(writes, string.format('%.3f', c) .. ':' .. now .. ':' .. string.format('%.12f', rates[i]))
  table.insert(writes, n .. '_left')
  table.insert(writes, math.floor(c))
  table.insert(writes, n .. '_reset')
  table.insert(writes, now + math.ceil((lims[i] - c) / rates[i]))
end
`

// bucketArgs are leaseScript's last arguments: each window's rate in
// units per ms (0: a fixed window), then bucketLease in ms.
func bucketArgs(rates [2]float64) []any {
	return []any{rates[0] / 1000, rates[1] / 1000, bucketLease.Milliseconds()}
}

// refilled is what a bucket of limit refilling at rate units per second
// holds d after it held remaining.
func refilled(remaining, limit int64, rate float64, d time.Duration) int64 {
	if rate <= 0 || d <= 0 {
		return remaining
	}
	return min(limit, remaining+int64(rate*d.Seconds()))
}
