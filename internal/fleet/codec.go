package fleet

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// The parts of a deployment's shared state, as fields of its state hash and
// lines of a notification: c (circuit), r (requests window), t (tokens
// window), d (an operator's drain). Each value is a small JSON object with
// instants in Unix milliseconds (0 = none); the hash also holds <part>_at
// and <part>_exp.
const (
	partCircuit  = "c"
	partRequests = "r"
	partTokens   = "t"
	partDrain    = "d"
)

// drainKeep is how long a drain stays in the store: an operator's decision
// holds until it is lifted (a year is as long as the store need keep it).
const drainKeep = 365 * 24 * time.Hour

type drainJSON struct {
	At       int64 `json:"at"`
	Disabled bool  `json:"disabled"`
}

type circuitJSON struct {
	At       int64  `json:"at"`
	Until    int64  `json:"until"`
	Reason   string `json:"reason"`
	Failures int    `json:"failures"`
}

type windowJSON struct {
	At        int64 `json:"at"`
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	Reset     int64 `json:"reset"`
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(v)
}

// clockSkew is how far ahead of the reader's clock (or Redis' own, TIME) a
// part's stamp may be and still be trusted: instances whose clocks agree
// within it order their learnings as they happened. A part stamped later
// comes from a clock that runs ahead, and is not taken (see trusted).
const clockSkew = 5 * time.Second

// trusted returns sh without the parts that cannot be trusted at now: one
// stamped more than clockSkew after now is dropped (a circuit stamped a year
// ahead would otherwise disable the deployment on every instance, and win
// over every later learning), and an open-until or a reset is bounded to
// provider.MaxCooldown after its stamp, the longest wait any provider states.
func trusted(sh capacity.Shared, now time.Time) capacity.Shared {
	latest := now.Add(clockSkew)
	bound := func(at, t time.Time) time.Time {
		if t.After(at.Add(provider.MaxCooldown)) {
			return at.Add(provider.MaxCooldown)
		}
		return t
	}
	if sh.Circuit.At.After(latest) {
		sh.Circuit = capacity.SharedCircuit{}
	}
	sh.Circuit.OpenUntil = bound(sh.Circuit.At, sh.Circuit.OpenUntil)
	for _, w := range []*capacity.SharedWindow{&sh.Requests, &sh.Tokens} {
		if w.At.After(latest) {
			*w = capacity.SharedWindow{}
		}
		w.Reset = bound(w.At, w.Reset)
	}
	if sh.Drain.At.After(latest) {
		sh.Drain = capacity.SharedDrain{}
	}
	return sh
}

// part is one encoded part, ready for publishScript.
type part struct {
	name      string
	at, until int64 // learned at, expires at (Unix ms)
	value     string
}

// encode turns the parts of sh that are set into script arguments. A part
// expires at its reset (the circuit's open-until, the window's reset);
// one that states none (a closed circuit, a window without a reset) stays
// keep after it was learned, for the instances that poll.
func encode(sh capacity.Shared, keep time.Duration) []part {
	expires := func(at, reset time.Time) int64 {
		if reset.After(at) {
			return ms(reset)
		}
		return ms(at.Add(keep))
	}
	var out []part
	if c := sh.Circuit; !c.At.IsZero() {
		v, _ := json.Marshal(circuitJSON{At: ms(c.At), Until: ms(c.OpenUntil), Reason: c.Reason.String(), Failures: c.Failures})
		out = append(out, part{partCircuit, ms(c.At), expires(c.At, c.OpenUntil), string(v)})
	}
	for _, w := range []struct {
		name string
		w    capacity.SharedWindow
	}{{partRequests, sh.Requests}, {partTokens, sh.Tokens}} {
		if w.w.At.IsZero() {
			continue
		}
		v, _ := json.Marshal(windowJSON{At: ms(w.w.At), Limit: w.w.Limit, Remaining: w.w.Remaining, Reset: ms(w.w.Reset)})
		out = append(out, part{w.name, ms(w.w.At), expires(w.w.At, w.w.Reset), string(v)})
	}
	if d := sh.Drain; !d.At.IsZero() {
		v, _ := json.Marshal(drainJSON{At: ms(d.At), Disabled: d.Disabled})
		until := d.At.Add(keep)
		if d.Disabled {
			until = d.At.Add(drainKeep)
		}
		out = append(out, part{partDrain, ms(d.At), ms(until), string(v)})
	}
	return out
}

// decodePart folds one part's value into sh; an unknown or malformed part
// is ignored (a newer version of the router may share more).
func decodePart(sh *capacity.Shared, name, value string) {
	switch name {
	case partCircuit:
		var c circuitJSON
		if json.Unmarshal([]byte(value), &c) != nil || c.At <= 0 {
			return
		}
		reason, ok := provider.ParseClass(c.Reason)
		if !ok {
			return
		}
		sh.Circuit = capacity.SharedCircuit{At: fromMS(c.At), OpenUntil: fromMS(c.Until), Reason: reason, Failures: max(c.Failures, 0)}
	case partRequests, partTokens:
		var w windowJSON
		if json.Unmarshal([]byte(value), &w) != nil || w.At <= 0 {
			return
		}
		sw := capacity.SharedWindow{At: fromMS(w.At), Limit: max(w.Limit, provider.Unknown),
			Remaining: max(w.Remaining, provider.Unknown), Reset: fromMS(w.Reset)}
		if name == partRequests {
			sh.Requests = sw
		} else {
			sh.Tokens = sw
		}
	case partDrain:
		var d drainJSON
		if json.Unmarshal([]byte(value), &d) != nil || d.At <= 0 {
			return
		}
		sh.Drain = capacity.SharedDrain{At: fromMS(d.At), Disabled: d.Disabled}
	}
}

// decodeMessage splits a notification, "<origin>\n<deployment id>" then a
// line "<part>\t<value>" per part.
func decodeMessage(payload string) (origin, id string, sh capacity.Shared, ok bool) {
	lines := strings.Split(payload, "\n")
	if len(lines) < 3 {
		return "", "", sh, false
	}
	for _, line := range lines[2:] {
		name, value, found := strings.Cut(line, "\t")
		if found {
			decodePart(&sh, name, value)
		}
	}
	return lines[0], lines[1], sh, true
}
