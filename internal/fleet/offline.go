package fleet

import (
	"cmp"
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// What an instance starts on its own declared window while it holds no
// places and cannot reach Redis (Reserve's fallback) is reported to the
// fleet's minute once Redis answers again: as a grant fully used,
// "<id>:<requests>:<tokens>", scored by Redis' clock when it is reported
// (it counts a minute from then: later than the attempts started, never
// earlier). A report is sent as is until Redis confirms it, and added
// only if its member is not there (ZADD NX): a retry whose first reply
// was lost counts once. An attempt started on a grant after the fallback
// began is counted again (never less than was started).

// offlineScript adds a report to a declared log.
//
//	KEYS[1]  the log, ARGV[1] the report's member, ARGV[2] the log's
//	         expiry (ms: a window and a grant's use)
var offlineScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], 'NX', now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// offline marks that Reserve fell back to local state at now (the first
// fallback of an outage starts the count).
func (p *places) offline(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.offFrom.IsZero() {
		p.offFrom = now
	}
}

// report returns the report to send: the one not yet confirmed, else one
// of what b's state started since the fallback began ("" when nothing).
func (b *binding) report(now time.Time) string {
	p := &b.places
	if b.st == nil {
		return p.consumerReport(b.s.nextToken)
	}
	p.mu.Lock()
	from, rep := p.offFrom, p.report
	p.mu.Unlock()
	if rep != "" || from.IsZero() {
		return rep
	}
	n, tok := b.st.DeclaredSince(from.Add(-time.Millisecond), now)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.offFrom = time.Time{}
	if n > 0 {
		p.report = b.s.nextToken() + ":" + strconv.FormatInt(n, 10) + ":" + strconv.FormatInt(tok, 10)
	}
	return p.report
}

// reportOffline sends b's report, if any (the lease loop, Redis up).
func (b *binding) reportOffline(now time.Time) {
	rep := b.report(now)
	if rep == "" {
		return
	}
	ctx, cancel := b.bgContext(false)
	defer cancel()
	start := time.Now()
	if err := b.sendReport(ctx, rep); err != nil {
		b.s.callFailed(b.op(), err, start)
	}
}

// sendReport adds rep ("": none) to b's log, and forgets it once Redis
// confirms it.
func (b *binding) sendReport(ctx context.Context, rep string) error {
	if rep == "" {
		return nil
	}
	if err := offlineScript.Run(ctx, b.s.client, []string{b.logKey}, rep,
		(cmp.Or(b.window, capacity.DeclaredWindow) + declaredUse).Milliseconds()).Err(); err != nil {
		return err
	}
	p := &b.places
	p.mu.Lock()
	if p.report == rep {
		p.report = ""
	}
	p.mu.Unlock()
	return nil
}
