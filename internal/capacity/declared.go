package capacity

import "time"

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

// availableAt returns when an attempt of tokens tokens fits the declared
// limits: at once, or when enough of the last minute's attempts expire. A
// request larger than the whole tpm goes alone, once the window is empty.
func (d *declared) availableAt(now time.Time, tokens int64) time.Time {
	if !d.active() {
		return now
	}
	d.prune(now)
	at := now
	live := d.log[d.head:]
	if d.rpm > 0 && int64(len(live)) >= d.rpm {
		at = live[int64(len(live))-d.rpm].at.Add(declaredWindow)
	}
	if d.tpm > 0 && len(live) > 0 && d.tokens+tokens > d.tpm {
		freed := int64(0)
		for i, st := range live {
			freed += st.tokens
			if d.tokens-freed+tokens <= d.tpm || i == len(live)-1 {
				if t := st.at.Add(declaredWindow); t.After(at) {
					at = t
				}
				break
			}
		}
	}
	return at
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
