package fleet

import (
	"strconv"

	"github.com/redis/go-redis/v9"
)

// skewMS is clockSkew in the scripts' unit (ms).
var skewMS = strconv.FormatInt(clockSkew.Milliseconds(), 10)

// publishScript writes the parts of a deployment's shared state that are
// newer than what the hash holds (the newest learning of each part wins,
// whichever instance it came from), sets the hash to expire when its last
// part does, and, when asked, publishes the parts it wrote to the fleet. A
// part stamped more than clockSkew after Redis' own clock (TIME), or whose
// stamp is not a number, is not trusted: any write replaces it (else an
// instance whose clock runs ahead would hold the part for good); an expiry
// that is not a number is ignored; a key of another type is replaced.
//
//	KEYS[1]  the deployment's state hash
//	ARGV[1]  channel to notify ('' = no notification)
//	ARGV[2]  message head: "<origin>\n<deployment id>"
//	ARGV[3..] per part: name (c, r, t, d), learned at (Unix ms), expires at (Unix ms), value
//
// It returns 1 when a part was written, else 0.
var publishScript = redis.NewScript(`
-- One read of every stamp and expiry; a key of another type is replaced.
local ok, cur = pcall(redis.call, 'HMGET', KEYS[1], 'c_at', 'r_at', 't_at', 'd_at', 'c_exp', 'r_exp', 't_exp', 'd_exp')
if not ok then
  redis.call('DEL', KEYS[1])
  cur = {}
end
local index = {c = 1, r = 2, t = 3, d = 4}
local t = redis.call('TIME')
local latest = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + ` + skewMS + `
local applied, exps = '', {}
for k = 1, 4 do
  exps[k] = tonumber(cur[k + 4] or '0') or 0
end
for i = 3, #ARGV, 4 do
  local name, at, k = ARGV[i], tonumber(ARGV[i + 1]), index[ARGV[i]]
  local was = k and (tonumber(cur[k] or '0') or 0) or 0
  if was > latest then
    was = 0
  end
  if k and at > was then
    redis.call('HSET', KEYS[1], name, ARGV[i + 3], name .. '_at', ARGV[i + 1], name .. '_exp', ARGV[i + 2])
    applied = applied .. '\n' .. name .. '\t' .. ARGV[i + 3]
    exps[k] = tonumber(ARGV[i + 2]) or 0
  end
end
if applied == '' then
  return 0
end
redis.call('PEXPIREAT', KEYS[1], math.max(exps[1], exps[2], exps[3], exps[4]))
if ARGV[1] ~= '' then
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. applied)
end
return 1
`)

// declaredScript leases places in a deployment's declared rpm/tpm over the
// fleet-wide sliding window, atomically (see declared.go): a log of the
// grants (a sorted set; each member "<grant id>:<requests>:<tokens>",
// scored by Redis' own clock at the end of the grant's use, so that the
// instances' clocks do not matter, and a grant counts in the window from
// when it is made until a window after its last possible use) and the sum
// of their tokens. So, like the local window, a limit of 60 rpm never lets
// 61 attempts start within any 60 s, and an attempt larger than the whole
// tpm goes alone once the window is empty. What a grant did not use is
// given back (its member rewritten with what it used) by the next call.
// Both keys expire with the window.
//
//	KEYS[1]  the log, KEYS[2] the token sum
//	ARGV[1]  window (ms), ARGV[2] rpm, ARGV[3] tpm (0 = none), ARGV[4]
//	         requests and ARGV[5] tokens needed (0, 0: a renewal), ARGV[6]
//	         requests and ARGV[7] tokens asked, ARGV[8] how long the
//	         grant is used (ms), ARGV[9] its id, ARGV[10] the member of a
//	         grant given back ('' = none), ARGV[11], ARGV[12] the requests
//	         and tokens it used, ARGV[13] the retry (ms, below; 0: none),
//	         ARGV[14], ARGV[15] the requests and tokens the caller's grants
//	         in use hold unused (with a retry)
//
// What cannot be a log the script wrote is replaced, and counted in the
// reply's last element: a key of the wrong type (both are deleted), an
// entry scored later than a grant can end (clockSkew after Redis' clock
// and a grant's use), one in the window that is no grant, a token sum that
// is no number (it is counted again).
//
// It returns {1, 0, requests granted, tokens granted, replaced} ({1, wait
// in ms, 0, 0, replaced}: a renewal found the window spent for that long,
// or with less than a share of a declared limit left: a renewal gets no
// grant of 0 requests or 0 tokens of a declared limit, which no attempt
// could use),
// or {0, wait in ms, full, 0, replaced} when the window is spent for that
// long for the attempt (full: 1 its requests, 2 its tokens). With a retry,
// each call states what the caller's grants in use hold unused, with this
// call's grant (a member "s:<origin>:<requests>:<tokens>" scored at the
// end of the grant's use, replaced by its next call; not a grant): an
// attempt the window cannot hold, but would if the other instances'
// unused places as they stated them came back, is told to wait the retry
// at most (what a grant did not use comes back by its instance's next
// call once its use ends), not until the window frees.
var declaredScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window, rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local needR, needT, askR, askT, use = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local replaced = 0
-- A key of another type fails its first command: both are replaced.
local okSum, sum = pcall(redis.call, 'GET', KEYS[2])
local okLog = pcall(redis.call, 'ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if not okSum or not okLog then
  redis.call('DEL', KEYS[1], KEYS[2])
  replaced, sum = replaced + 1, false
end
if sum and not tonumber(sum) then
  replaced = replaced + 1
end
replaced = replaced + redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. (now + use + ` + skewMS + `), '+inf')
if ARGV[10] ~= '' then
  local sc = redis.call('ZSCORE', KEYS[1], ARGV[10])
  local id = string.match(ARGV[10], '^(.*):%d+:%d+$')
  if sc and id then
    redis.call('ZREM', KEYS[1], ARGV[10])
    if tonumber(ARGV[11]) > 0 or tonumber(ARGV[12]) > 0 then
      redis.call('ZADD', KEYS[1], sc, id .. ':' .. ARGV[11] .. ':' .. ARGV[12])
    end
  end
end
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local n, used, origins, active = 0, 0, {}, 0
local counts = {}
-- Each instance's statement of what its grants in use hold unused
-- ("s:<origin>:<requests>:<tokens>", scored at the end of its use; see
-- below): the others' may come back (what a grant did not use comes back
-- by its instance's next call once its use ends).
local mine, retry, liveR, liveT = string.match(ARGV[9], '^[^-]*'), tonumber(ARGV[13] or '0') or 0, 0, 0
for i = 1, #all, 2 do
  local so, sr, sk = string.match(all[i], '^s:([^:]*):(%d+):(%d+)$')
  local id, r, k = string.match(all[i], '^(.*):(%d+):(%d+)$')
  if not id then
    id, k = string.match(all[i], '^(.*):(%d+)$')
    r = 1
  end
  if so then
    if so == mine then
      redis.call('ZREM', KEYS[1], all[i])
    elseif tonumber(all[i + 1]) > now then
      liveR, liveT = liveR + tonumber(sr), liveT + tonumber(sk)
    end
  elseif not id then
    redis.call('ZREM', KEYS[1], all[i])
    replaced = replaced + 1
    table.insert(counts, {0, 0, 0})
  else
    n, used = n + tonumber(r), used + tonumber(k)
    table.insert(counts, {tonumber(r), tonumber(k), tonumber(all[i + 1])})
    local o = string.match(id, '^[^-]*')
    if not origins[o] then
      origins[o], active = true, active + 1
    end
  end
end
-- The caller's statement (with a retry only: a deployment's minute): what
-- its grants in use hold unused (ARGV[14], ARGV[15]) and what this call
-- grants beyond the attempt's need.
local function state(r, k)
  if retry > 0 and (r > 0 or k > 0) then
    redis.call('ZADD', KEYS[1], now + use, 's:' .. mine .. ':' .. r .. ':' .. k)
  end
end
local unusedR, unusedT = tonumber(ARGV[14] or '0') or 0, tonumber(ARGV[15] or '0') or 0
-- When enough of the window frees: the oldest grants leave it a window
-- after their score.
local function freed(fits)
  local r, k = n, used
  for _, c in ipairs(counts) do
    r, k = r - c[1], k - c[2]
    if fits(r, k) then
      return c[3] + window - now
    end
  end
  return window
end
-- A refusal the others' unused places (as they stated them) would hold
-- is told the retry (ms, 0: none), not to wait until the window frees.
local function refused(fits, wait, full)
  if retry > 0 and fits then
    wait = math.min(wait, retry)
  end
  state(unusedR, unusedT)
  return {0, math.max(wait, 1), full, 0, replaced}
end
local share = 4 * math.max(active, 1)
local gotR, gotT = math.max(needR, askR), math.max(needT, askT)
if rpm > 0 then
  if needR > 0 and n + needR > rpm then
    return refused(n - liveR + needR <= rpm, freed(function(r, k) return r + needR <= rpm end), 1)
  end
  gotR = math.max(0, math.min(rpm - n, math.max(needR, math.min(askR, math.floor((rpm - n) / share)))))
end
if tpm > 0 then
  if (needR > 0 or needT > 0) and n > 0 and used + needT > tpm then
    return refused(n <= liveR or used - liveT + needT <= tpm, freed(function(r, k) return r == 0 or k + needT <= tpm end), 2)
  end
  gotT = math.max(needT, math.min(tpm - used, math.min(askT, math.floor((tpm - used) / share))))
end
local full = 0
-- A renewal granted no place of a declared limit (the window spent, or
-- what it has left below a share) is no grant: no entry, and the wait is
-- until a renewal would be granted places.
local none = needR == 0 and needT == 0 and (rpm > 0 and gotR == 0 or tpm > 0 and gotT == 0)
if (gotR > 0 or gotT > 0) and not none then
  redis.call('ZADD', KEYS[1], now + use, ARGV[9] .. ':' .. gotR .. ':' .. gotT)
  used = used + gotT
  state(unusedR + math.max(gotR - needR, 0), unusedT + math.max(gotT - needT, 0))
elseif none then
  state(unusedR, unusedT)
  full = freed(function(r, k) return (rpm == 0 or r + share <= rpm) and (tpm == 0 or k + share <= tpm) end)
else
  state(unusedR, unusedT)
  full = freed(function(r, k) return (rpm == 0 or r < rpm) and (tpm == 0 or k < tpm) end)
end
redis.call('PEXPIRE', KEYS[1], window + use)
redis.call('SET', KEYS[2], used, 'PX', window + use)
return {1, full, gotR, gotT, replaced}
`)

// claimScript takes a half-open probe's claim if no instance holds it (SET
// NX with a TTL, so that a claim held by an instance that died expires). A
// claim the router did not write (one without expiry, or expiring later
// than a claim may) is bounded to the TTL: else it would keep a recovered
// deployment half-open and unused for good.
//
//	KEYS[1]  the claim, ARGV[1] the claimant's token, ARGV[2] the TTL (ms)
//
// It returns 1 when the claim was taken, 0 when another holds it, 2 when
// another holds it and its expiry was bounded.
var claimScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 or ttl > tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 2
end
return 0
`)

// releaseScript deletes a probe claim if it is still the given owner's (a
// claim that expired and was taken by another instance stays).
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// leaseScript grants (and takes back) slices of a deployment's budget: its
// stated windows (requests r, tokens t), one for the whole fleet (see
// lease.go). A window the hash does not hold yet starts as the calling
// instance knows it; a window whose reset passed (by Redis' clock) is full
// again, its next reset a span (and a margin) after now, not after the
// last reset: a window that starts at its first request starts with this
// call's attempt at the earliest. Within the same window (the one the
// hash held, or the next one once it rolled), what the instance knows
// corrects the budget (a later reset an answer stated or it projected,
// and less left), and so does the latest reset any instance learned. A slice given back is added to the window it was
// granted in (a reset within half a span of it; none other: a slice never
// outlives its window). Then, when
// a window the attempt needs holds less than it lacks (a need larger than
// the whole window goes on a full one), nothing is granted (a remainder
// above the limit is the limit); else each
// window grants what was asked, no more than it holds, nor more than a
// quarter of an equal share of it among the active instances (what is
// needed always): slices shrink as the window runs low, so that when the
// fleet asks for more than the window holds, each instance takes what its
// requests need, and none holds a slice while another's requests wait.
// What is granted leaves the window's remainder at once: the slices out
// never add up to more than the window held. The hash expires a span
// after its last reset.
//
//	KEYS[1]  the budget hash, KEYS[2] the deployment's state hash (the
//	         windows as the fleet last learned them; see publishScript)
//	ARGV     per window (r, then t): limit (-1: not asked), remaining,
//	         reset (Unix ms), span (ms), need (what the attempt lacks; 0:
//	         none), ask, give back, the reset its slice was granted in;
//	         then the margin added to each reset (ms; a provider's window
//	         may start a little later), the instance's id, what its
//	         slices hold unspent (r, t; less what the attempt spends of
//	         them), how long its statement of them counts (ms), the retry
//	         (ms, below), and the allowances of its slices (r, t: what it
//	         may spend of them before it states them again); then each
//	         window's rate (units per ms; 0: a fixed window; below 0: one
//	         the caller's statements proved fixed) and a bucket slice's
//	         lease (ms): a bucket is the script's bucketLua
//	         (bucket.go)
//
// Each call marks the instance as active; the reply counts the instances
// active within the last span. Each call also states what the instance's
// slices hold ('h:<id>' = "<r>:<t>:<until, Redis' ms>:<r parked>:<t
// parked>:<r reset>:<t reset>", what was granted included; parked: beyond
// the allowance): an attempt the window's remainder cannot hold, but the
// other instances' slices as they stated them would, is told to wait the
// retry (their slices are spent or given back soon), not until the window
// renews. A statement past its time is dropped, and what it parked is
// added to the window it was granted in (its instance forfeited its
// slices before, see lease.go); one of another shape is dropped. A call
// whose own statement no longer counts has its slices taken back: what it
// states it holds and gives back is not counted (kept 0 in the reply).
//
// It returns {1, 0, r left, r reset, t left, t reset, instances, r granted,
// t granted, now, kept, buckets} when granted (now: Redis' clock, ms;
// kept: 1 when the caller's statement counted; buckets: 1 when r is a
// bucket in the fleet's budget, plus 2 when t is, whose reset is then its
// slice's lease end), {0, wait in ms, ...} when a window is spent for that
// long (nothing granted).
var leaseScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- One read of each hash; a key of another type than the router writes is
-- replaced.
local function read(cmd, key, ...)
  local ok, v = pcall(redis.call, cmd, key, ...)
  if ok then
    return v
  end
  redis.call('DEL', key)
  return {}
end
local all, budget = read('HGETALL', KEYS[1]), {}
for j = 1, #all, 2 do
  budget[all[j]] = all[j + 1]
end
local state = read('HMGET', KEYS[2], 'r', 't')
-- What is known of the window of remainder r reset at rs: the instance's
-- window is the same when its reset is within half a span of it (an answer
-- may have told it a later reset, or less left: the provider's count is
-- the truth), and so is the reset the fleet last learned (a later reset).
local function known(r, rs, span, lrem, lreset, learned)
  if math.abs(lreset - rs) * 2 <= span then
    rs = math.max(rs, lreset)
    r = math.min(r, lrem)
  end
  if learned and math.abs(learned - rs) * 2 <= span then
    rs = math.max(rs, learned)
  end
  return r, rs
end
local names = {'r', 't'}
local margin = tonumber(ARGV[17])
local left, reset, wait, longest = {-1, -1}, {0, 0}, 0, 0
-- What the other instances' slices hold, as they stated it; what a
-- statement past its time (its instance forfeited its slices before)
-- parked goes back to the window it was granted in, once (the entry is
-- deleted). The caller's own entry: whether it still counts.
local mine, entry, retry = 'h:' .. ARGV[18], tonumber(ARGV[21]), tonumber(ARGV[22])
local others, stale, parked, live = {0, 0}, {}, {}, false
for j = 1, #all, 2 do
  if string.sub(all[j], 1, 2) == 'h:' then
    local hr, ht, he, kr, kt, rr, rt = string.match(all[j + 1], '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')
    if not hr then
      hr, ht, he = string.match(all[j + 1], '^(%d+):(%d+):(%d+)$')
    end
    hr, ht, he = tonumber(hr), tonumber(ht), tonumber(he)
    if hr and ht and he and he > now and he <= now + entry then
      if all[j] == mine then
        live = true
      else
        others[1], others[2] = others[1] + hr, others[2] + ht
      end
    else
      kr, kt = tonumber(kr), tonumber(kt)
      if kr and he and he <= now and kr <= hr and kt <= ht then
        table.insert(parked, {kr, tonumber(rr), kt, tonumber(rt)})
      end
      if all[j] ~= mine then
        table.insert(stale, all[j])
      end
    end
  end
end
-- A caller whose entry no longer counts (expired: what it parked went
-- back; or gone) states nothing of what it held nor gives it back: its
-- slices are taken back (the reply's kept, 0).
local heldR, heldT, gives, kept = tonumber(ARGV[19]), tonumber(ARGV[20]), {tonumber(ARGV[7]), tonumber(ARGV[15])}, 1
if not live and (heldR > 0 or heldT > 0 or gives[1] > 0 or gives[2] > 0) then
  heldR, heldT, gives, kept = 0, 0, {0, 0}, 0
end
local rates, lease = {tonumber(ARGV[25]), tonumber(ARGV[26])}, tonumber(ARGV[27])
` + bucketLua + `
for i = 1, 2 do
  local b = (i - 1) * 8
  local lim, lrem, lreset, span, need = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  if lim >= 0 and rates[i] > 0 then
    longest = math.max(longest, span)
    wait = math.max(wait, bucket(i, lim, lrem, need, gives[i], span))
  elseif lim >= 0 then
    longest = math.max(longest, span)
    -- What is no number, or a reset past any window from now, is not the
    -- fleet's count: the instance's own stands in.
    local r = tonumber(budget[names[i] .. '_left'] or '-1') or -1
    local rs = tonumber(budget[names[i] .. '_reset'] or '0') or 0
    if r < 0 or rs > now + 2 * span + margin then
      r, rs = lrem, lreset
    end
    -- The reset the fleet last learned (the state hash, which any
    -- instance's answers update).
    local learned, sv = nil, state[i]
    if sv then
      local ok, w = pcall(cjson.decode, sv)
      if ok and type(w) == 'table' and type(w.reset) == 'number' and w.reset > 0 then
        learned = w.reset
      end
    end
    r, rs = known(math.min(r, lim), rs, span, lrem, lreset, learned)
    if rs <= now and (need > 0 or tonumber(ARGV[b + 6]) > 0) then
      -- A window that starts at its first request (llm_mock's, and many
      -- providers') starts with the attempt this call is for at the
      -- earliest, later than a span after the last reset: the next one
      -- ends a span after now, as one instance alone takes it
      -- (capacity's nextReset; a span after the last reset was full
      -- again early, and two windows went into one). Then what the
      -- instance knows of it stands too. A call that asks nothing of it
      -- (a renewal of the other window) leaves it as it is: its first
      -- request may come much later.
      r, rs = known(lim, now + span + margin, span, lrem, lreset, learned)
    end
    if gives[i] > 0 and math.abs(tonumber(ARGV[b + 8]) - rs) * 2 <= span then
      r = math.min(r + gives[i], lim)
    end
    for _, p in ipairs(parked) do
      if p[2 * i - 1] > 0 and math.abs(p[2 * i] - rs) * 2 <= span then
        r = math.min(r + p[2 * i - 1], lim)
      end
    end
    local lacks = math.max(math.min(need, lim), 1)
    if need > 0 and r < lacks then
      if r + others[i] >= lacks then
        wait = math.max(wait, math.min(rs - now, retry))
      else
        wait = math.max(wait, rs - now)
      end
    end
    left[i], reset[i] = r, rs
  end
end
-- The instances that asked within the last span (each marks itself).
local me, active = 'o:' .. ARGV[18], 1
for j = 1, #all, 2 do
  if string.sub(all[j], 1, 2) == 'o:' and all[j] ~= me then
    local seen = tonumber(all[j + 1])
    if seen and now - seen <= longest then
      active = active + 1
    else
      table.insert(stale, all[j])
    end
  end
end
if #stale > 0 then
  redis.call('HDEL', KEYS[1], unpack(stale))
end
local granted, exp = {0, 0}, 0
for i = 1, 2 do
  if left[i] >= 0 then
    local b = (i - 1) * 8
    if wait == 0 then
      local need, ask = tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
      local share = math.floor(left[i] / (4 * math.max(active, 1)))
      granted[i] = math.min(math.floor(left[i]), math.max(need, math.min(ask, share)))
      left[i] = left[i] - granted[i]
    end
    exp = math.max(exp, reset[i] + tonumber(ARGV[b + 4]))
  end
end
local writes = {me, now}
-- The caller's statement: what its slices hold (less what the attempt
-- spends of this grant), what of it is parked beyond its allowance
-- (ARGV[23], ARGV[24]), and the windows' resets.
local spent = {0, 0}
if wait == 0 then
  spent = {math.max(tonumber(ARGV[5]), 0), math.max(tonumber(ARGV[13]), 0)}
end
local hr, ht = math.max(heldR + granted[1] - spent[1], 0), math.max(heldT + granted[2] - spent[2], 0)
if hr > 0 or ht > 0 then
  local kr, kt = math.max(hr - tonumber(ARGV[23]), 0), math.max(ht - tonumber(ARGV[24]), 0)
  table.insert(writes, mine)
  table.insert(writes, hr .. ':' .. ht .. ':' .. (now + entry) .. ':' .. kr .. ':' .. kt .. ':' .. reset[1] .. ':' .. reset[2])
else
  redis.call('HDEL', KEYS[1], mine)
end
for i = 1, 2 do
  if left[i] >= 0 and rates[i] > 0 then
    bucketWrites(writes, i)
  elseif left[i] >= 0 then
    if rates[i] < 0 then
      -- Proved fixed by the caller's statements: a bucket another
      -- instance misread is dropped, not taken up again by the others.
      redis.call('HDEL', KEYS[1], names[i] .. '_bucket')
    end
    table.insert(writes, names[i] .. '_left')
    table.insert(writes, left[i])
    table.insert(writes, names[i] .. '_reset')
    table.insert(writes, reset[i])
  end
end
redis.call('HSET', KEYS[1], unpack(writes))
if exp > 0 then
  redis.call('PEXPIREAT', KEYS[1], exp)
end
local buckets = 0
for i = 1, 2 do
  if left[i] >= 0 and rates[i] > 0 then
    buckets = buckets + i
  end
end
if wait > 0 then
  return {0, wait, left[1], reset[1], left[2], reset[2], active, 0, 0, now, kept, buckets}
end
return {1, 0, left[1], reset[1], left[2], reset[2], active, granted[1], granted[2], now, kept, buckets}
`)
