package capacity

import (
	"math"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// declaredWindow is the span of the operator's declared limits.
const declaredWindow = time.Minute

// declared enforces the operator's rpm and tpm over a sliding minute: a log
// of the attempts started in the last minute, so that a limit of 60 rpm
// never lets 61 requests go in any 60 seconds (a token bucket would let a
// full burst plus a minute of refill through).
type declared struct {
	rpm, tpm int64
	log      []stamp // oldest first, from head on
	head     int
	tokens   int64 // sum of log[head:].tokens
}

type stamp struct {
	at     time.Time
	tokens int64
}

func (d *declared) active() bool { return d.rpm > 0 || d.tpm > 0 }

// prune drops the attempts older than a minute.
func (d *declared) prune(now time.Time) {
	cutoff := now.Add(-declaredWindow)
	for d.head < len(d.log) && !d.log[d.head].at.After(cutoff) {
		d.tokens -= d.log[d.head].tokens
		d.head++
	}
	if d.head > 0 && d.head >= len(d.log)/2 {
		n := copy(d.log, d.log[d.head:])
		d.log, d.head = d.log[:n], 0
	}
}

func (d *declared) requestsIn(now time.Time) int64 {
	d.prune(now)
	return int64(len(d.log) - d.head)
}

func (d *declared) tokensIn(now time.Time) int64 {
	d.prune(now)
	return d.tokens
}

// limits returns the declared limits less the reserve an attempt must
// leave unspent (at least 1 request, if any).
func (d *declared) limits(reserve float64) (rpm, tpm int64) {
	rpm, tpm = d.rpm, d.tpm
	if reserve > 0 {
		rpm -= int64(math.Ceil(reserve * float64(rpm)))
		tpm -= int64(math.Ceil(reserve * float64(tpm)))
		if d.rpm > 0 {
			rpm = max(rpm, 1)
		}
		if d.tpm > 0 {
			tpm = max(tpm, 1)
		}
	}
	return rpm, tpm
}

// availableAt returns when an attempt of tokens tokens fits the declared
// limits (less the reserve it must leave): at once, or when enough of the
// last minute's attempts expire. A request larger than the whole tpm goes
// alone, once the window is empty.
func (d *declared) availableAt(now time.Time, tokens int64, reserve float64) time.Time {
	if !d.active() {
		return now
	}
	rpm, tpm := d.limits(reserve)
	d.prune(now)
	at := now
	live := d.log[d.head:]
	if rpm > 0 && int64(len(live)) >= rpm {
		at = live[int64(len(live))-rpm].at.Add(declaredWindow)
	}
	if tpm > 0 && len(live) > 0 && d.tokens+tokens > tpm {
		freed := int64(0)
		for i, st := range live {
			freed += st.tokens
			if d.tokens-freed+tokens <= tpm || i == len(live)-1 {
				if t := st.at.Add(declaredWindow); t.After(at) {
					at = t
				}
				break
			}
		}
	}
	return at
}

// forecast returns how many attempts, and of how many tokens, the declared
// limits (less the reserve) let start from now until until: what is left
// now, what expires from the last minute before until, and a whole limit
// per further minute; provider.Unknown for a limit not declared.
func (d *declared) forecast(now, until time.Time, reserve float64) (requests, tokens int64) {
	requests, tokens = provider.Unknown, provider.Unknown
	if !d.active() {
		return requests, tokens
	}
	rpm, tpm := d.limits(reserve)
	d.prune(now)
	var expiring, expiringTokens int64
	for _, st := range d.log[d.head:] {
		if st.at.Add(declaredWindow).After(until) {
			break
		}
		expiring++
		expiringTokens += st.tokens
	}
	minutes := int64(max(until.Sub(now), 0) / declaredWindow)
	if rpm > 0 {
		requests = max(rpm-int64(len(d.log)-d.head), 0) + expiring + minutes*rpm
	}
	if tpm > 0 {
		tokens = max(tpm-d.tokens, 0) + expiringTokens + minutes*tpm
	}
	return requests, tokens
}

// record counts an attempt started at now.
func (d *declared) record(now time.Time, tokens int64) {
	if !d.active() {
		return
	}
	d.prune(now)
	d.log = append(d.log, stamp{now, tokens})
	d.tokens += tokens
}

// DeclaredSince returns how many attempts started after since, and their
// tokens, that the declared window still counts at now (fleet mode: what
// an instance started on its own declared window while it could not reach
// the fleet's, to report once it can).
func (s *State) DeclaredSince(since, now time.Time) (requests, tokens int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := &s.declared
	d.prune(now)
	for _, st := range d.log[d.head:] {
		if st.at.After(since) {
			requests, tokens = requests+1, tokens+st.tokens
		}
	}
	return requests, tokens
}
