package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// The fleet's queue in fair share. A request of a consumer (JoinAs) is
// placed among those of its priority by its consumer's start tag of
// start-time fair queueing, fleet-wide, as each instance's own queue
// places it (router/queue.go fairTag): its start is the later of the
// priority's virtual time and its consumer's last finish, its finish its
// start plus 1/weight. The virtual time is the start of the last request
// that left the priority's head anywhere in the fleet (served, mostly: a
// consumer that had nothing waiting starts level with it, with no credit
// for its idle time), and the tags start again from 0 once nothing of the
// priority waits. So
// backlogged consumers are served in proportion to their weights, whichever
// instances their requests wait on, and one consumer's requests keep their
// order of joining. The tags live in the queue's :fair hash (per priority:
// "g<base>" the tags' generation, "v<base>" the virtual time,
// "f<base>:<consumer's hash>" "<generation>:<last finish>"), in the
// queue's hash slot, expiring with it; in the waiting set a fair member's
// score is its priority's base plus its start, below fairBand, and its
// name ends with its consumer's hash and its cost (fairMember).
//
// A request that leaves unserved (LeaveUnserved: its deadline, a 429, its
// client gone) gives its turn back, as each instance's queue does
// (router/queue.go unspend): its consumer's last finish moves back by its
// cost, and so do the starts of its consumer's requests after it, so that
// a consumer whose requests leave unserved is not charged for turns it
// never had. The virtual time moves only when a request is served. A
// request leaves served to claim capacity (router's take: it is never in
// the queue and the windows at once); one whose claim is then refused
// joins again with GiveBack, placed with the turn it had (fairRejoin),
// and is charged no second one.

// fairUnits is the fair tags' unit: a request of weight 1 costs fairUnits
// (weight 1000, the largest, costs 1: scores stay whole at every priority).
const fairUnits = 1000

// fairCost is what a request of weight costs in fair units.
func fairCost(weight float64) float64 { return fairUnits / weight }

// placeBase is the score of a priority's first place (placeScore without
// the arrival).
func placeBase(priority, maxPriority int) float64 { return float64(maxPriority-priority) * (1 << 42) }

// fairID names a consumer in the fair hash: a hash of its name, so that no
// key or field shows it.
func fairID(consumer string) string {
	sum := sha256.Sum256([]byte("llm_router fair\x00" + consumer))
	return hex.EncodeToString(sum[:8])
}

// fairMember names a fair join's member: the instance's name of it, then
// its consumer's hash (fairID) and its cost in fair units, which a Leave
// of it unserved gives back (fairGiveBack).
func fairMember(member, consumer string, cost float64) string {
	return member + ":" + consumer + ":" + strconv.FormatFloat(cost, 'g', -1, 64)
}

// fairJoin is the Lua of a fair join (queueBatchScript, after queueLib):
// fairScore(base, consumer, cost) returns the member's score and keeps the
// consumer's finish; fairRejoin(base, consumer, cost) the score of one
// that joins again after its claim was refused (Joining.GiveBack), with
// the turn it had; fairLeave(member) moves the virtual time;
// fairGiveBack(members) takes out members that leave unserved and gives
// their turns back. Fair scores stay below base + fairBand (2^40), under
// the arrival scores of the same priority (Unix ms, 2^40 and more since
// 2004), which a config without consumers sharing the queue writes.
const fairJoin = `
local fairBand = 1099511627776
local function fairHead(base)
  return redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%.17g', base), '(' .. string.format('%.17g', base + fairBand), 'WITHSCORES', 'LIMIT', 0, 1)
end
-- fairLeave advances a priority's virtual time to the start of m, a
-- member about to leave, when m is a fair member at its priority's head.
local function fairLeave(m)
  local sc = tonumber(redis.call('ZSCORE', KEYS[1], m))
  if not sc then
    return
  end
  local base = math.floor(sc / 4398046511104) * 4398046511104
  if sc - base >= fairBand then
    return
  end
  local head = fairHead(base)
  if head[1] == m then
    local pk = string.format('%.0f', base)
    local v = tonumber(redis.call('HGET', KEYS[5], 'v' .. pk)) or 0
    redis.call('HSET', KEYS[5], 'v' .. pk, string.format('%.17g', math.max(v, sc - base)))
  end
end
-- fairOf returns the consumer's hash and cost of a fair member's name
-- (nil for another member).
local function fairOf(m)
  local c, cost = string.match(m, ':(%x+):([^:]+)$')
  return c, tonumber(cost)
end
-- fairFinish moves consumer c's last finish at priority pk back by d,
-- in the tags' generation.
local function fairFinish(pk, c, d)
  local got = redis.call('HMGET', KEYS[5], 'g' .. pk, 'f' .. pk .. ':' .. c)
  local fg, ff = string.match(got[2] or '', '^(%d+):(.+)$')
  if fg and tonumber(fg) == (tonumber(got[1]) or 0) and tonumber(ff) then
    redis.call('HSET', KEYS[5], 'f' .. pk .. ':' .. c, fg .. ':' .. string.format('%.17g', math.max(tonumber(ff) - d, 0)))
  end
end
-- fairShift moves each member of priority p's consumers after those that
-- left (p.cs[c]: their starts and costs, by start) up by their costs, in
-- one pass over the priority's members from p.from.
local function fairShift(p)
  local at = {}
  local xs = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%.17g', p.from), '(' .. string.format('%.17g', p.base + fairBand), 'WITHSCORES')
  for i = 1, #xs, 2 do
    local c = fairOf(xs[i])
    local l = c and p.cs[c]
    if l then
      local sc, st = tonumber(xs[i + 1]), at[c] or {k = 1, d = 0}
      at[c] = st
      while st.k <= #l and l[st.k][1] < sc do
        st.d, st.k = st.d + l[st.k][2], st.k + 1
      end
      if st.d > 0 then
        redis.call('ZADD', KEYS[1], string.format('%.17g', math.max(sc - st.d, p.base)), xs[i])
      end
    end
  end
end
-- fairGiveBack takes out members ms, which leave unserved, and gives back
-- the turns of the fair ones: their consumers' finishes move back by their
-- costs, and the consumers' members after them move up.
local function fairGiveBack(ms)
  local per = {}
  for _, m in ipairs(ms) do
    local sc, c, cost = tonumber(redis.call('ZSCORE', KEYS[1], m)), fairOf(m)
    if sc and c and cost then
      local base = math.floor(sc / 4398046511104) * 4398046511104
      if sc - base < fairBand then
        local pk = string.format('%.0f', base)
        local p = per[pk] or {base = base, from = sc, cs = {}}
        per[pk], p.from = p, math.min(p.from, sc)
        p.cs[c] = p.cs[c] or {}
        table.insert(p.cs[c], {sc, cost})
      end
    end
    drop(m)
  end
  for pk, p in pairs(per) do
    for c, l in pairs(p.cs) do
      table.sort(l, function(a, b) return a[1] < b[1] end)
      local d = 0
      for _, e in ipairs(l) do
        d = d + e[2]
      end
      fairFinish(pk, c, d)
    end
    fairShift(p)
  end
end
local function fairScore(base, c, cost)
  local pk = string.format('%.0f', base)
  local got = redis.call('HMGET', KEYS[5], 'g' .. pk, 'v' .. pk, 'f' .. pk .. ':' .. c)
  local gen, v = tonumber(got[1]) or 0, tonumber(got[2]) or 0
  if #fairHead(base) == 0 then
    gen, v = gen + 1, 0
  end
  local f = 0
  if got[3] then
    local fg, ff = string.match(got[3], '^(%d+):(.+)$')
    if tonumber(fg) == gen then
      f = tonumber(ff) or 0
    end
  end
  local start = math.min(math.max(v, f), fairBand - cost)
  redis.call('HSET', KEYS[5], 'g' .. pk, gen, 'v' .. pk, string.format('%.17g', v), 'f' .. pk .. ':' .. c, gen .. ':' .. string.format('%.17g', start + cost))
  return string.format('%.17g', base + start)
end
-- fairRejoin returns the score of a fair member of consumer c that joins
-- again after its claim was refused (it left served: 'r'), with the turn
-- it had, not a new one: just before its consumer's first member waiting
-- at the priority (the consumer's starts follow one another by their
-- costs, and its last finish counts it still), or, none waiting, at its
-- last finish less its cost, as a Leave unserved would have left it.
local function fairRejoin(base, c, cost)
  local xs = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%.17g', base), '(' .. string.format('%.17g', base + fairBand), 'WITHSCORES')
  for i = 1, #xs, 2 do
    if fairOf(xs[i]) == c then
      return string.format('%.17g', math.max(tonumber(xs[i + 1]) - cost, base))
    end
  end
  fairFinish(string.format('%.0f', base), c, cost)
  return fairScore(base, c, cost)
end
`
