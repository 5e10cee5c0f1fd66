package fleet

import (
	"cmp"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// A consumer's limits through a Redis outage. While the store cannot
// answer (down, or slower than its timeout), an instance admits a
// consumer up to its share of each limit: the limit divided by the
// instances the fleet's census last counted (census.go), on its own counts
// of the same sliding minute (rpm, tpm) and of its requests in flight
// (concurrent). What it admitted in the minute before the outage, and the
// places it still holds (its grants, its live slice), count toward that
// share, so N instances together admit no more than the limit plus the
// places they held, and each keeps serving its share (the rule of the
// deployments' windows: an instance spends from its lease and what it
// holds, never more than its slice). An instance that never counted the
// fleet admits nothing on its own. When Redis answers again, the
// requests admitted on the instance's own counts are reported to the
// fleet's minute (as a grant fully used: offline.go), and a slice is
// renewed with the places in flight (concurrentScript never grants less),
// so the fleet's counts include the outage's admissions.

// errShareSpent is a consumer's request refused on this instance's share
// while the store cannot answer.
var errShareSpent = errors.New("fleet store unavailable, and this instance admitted its share of the consumer's limit")

// minuteBuckets is how many buckets localMinute keeps: a minute of 60 and
// the current one, so that what it counts outlives the minute a little,
// never less.
const minuteBuckets = 61

// localMinute counts what this instance admitted of one consumer in the
// last window, in buckets of a sixtieth of it (a second of a minute).
type localMinute struct {
	index            [minuteBuckets]int64 // each bucket's number (Unix time in widths)
	requests, tokens [minuteBuckets]int64
}

// add counts requests and tokens at now, in buckets of width.
func (m *localMinute) add(now time.Time, width time.Duration, requests, tokens int64) {
	i := now.UnixNano() / int64(width)
	k := i % minuteBuckets
	if m.index[k] != i {
		m.index[k], m.requests[k], m.tokens[k] = i, 0, 0
	}
	m.requests[k] += requests
	m.tokens[k] += tokens
}

// sum returns the requests and tokens counted in the window at now.
func (m *localMinute) sum(now time.Time, width time.Duration) (requests, tokens int64) {
	i := now.UnixNano() / int64(width)
	for k, at := range m.index {
		if at > i-minuteBuckets && at <= i {
			requests += m.requests[k]
			tokens += m.tokens[k]
		}
	}
	return requests, tokens
}

// width is the buckets' width of c's minute.
func (c *consumerLimits) width() time.Duration {
	return max(cmp.Or(c.b.window, capacity.DeclaredWindow)/(minuteBuckets-1), time.Millisecond)
}

// admitted counts a request of tokens the fleet admitted at now.
func (c *consumerLimits) admitted(now time.Time, tokens int64) {
	c.mu.Lock()
	c.minute.add(now, c.width(), 1, tokens)
	c.mu.Unlock()
}

// offline decides a request of tokens at now on this instance's share of
// rpm and tpm (0: not limited) while the store cannot answer: nil when it
// admits it (counted, and kept for the report), errShareSpent when the
// share is spent or the fleet was never counted.
func (c *consumerLimits) offline(now time.Time, rpm, tpm, tokens int64) error {
	s := c.b.s
	s.obs.Fallback("consumer")
	n := s.instances()
	tokens = max(tokens, 0)
	c.mu.Lock()
	r, tok := c.minute.sum(now, c.width())
	if n == 0 || rpm > 0 && r+1 > rpm/n || tpm > 0 && tok+tokens > tpm/n {
		c.mu.Unlock()
		return errShareSpent
	}
	c.minute.add(now, c.width(), 1, tokens)
	c.mu.Unlock()
	p := &c.b.places
	p.mu.Lock()
	p.offRequests++
	p.offTokens += tokens
	p.mu.Unlock()
	return nil
}

// consumerReport returns the report of a consumer's minute to send: the
// one not yet confirmed, else one of what the instance admitted on its
// own counts since the last ("" when nothing).
func (p *places) consumerReport(token func() string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.report == "" && (p.offRequests > 0 || p.offTokens > 0) {
		p.report = token() + ":" + strconv.FormatInt(p.offRequests, 10) + ":" + strconv.FormatInt(p.offTokens, 10)
		p.offRequests, p.offTokens = 0, 0
	}
	return p.report
}

// offline admits a request into this instance's share of limit places in
// flight while the store cannot answer (its places in flight count toward
// it): release gives it back; ok is false when the share is full or the
// fleet was never counted.
func (f *flightSlice) offline(now time.Time, limit int) (release func(), ok bool) {
	s := f.s
	s.obs.Fallback("concurrent")
	n := s.instances()
	f.mu.Lock()
	ok = n > 0 && int64(f.used) < int64(limit)/n
	if ok {
		f.used++
		f.peak, f.taken = max(f.peak, f.used), now
	}
	f.mu.Unlock()
	if !ok {
		return nil, false
	}
	return f.releaser(), true
}

// releaser returns a release of one place of f, that frees it once.
func (f *flightSlice) releaser() func() {
	var once sync.Once
	return func() { once.Do(f.release) }
}
