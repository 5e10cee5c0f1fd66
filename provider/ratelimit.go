package provider

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Decoders shared by the wire families: counts, resets, Retry-After and the
// "try again in 20s" hints providers put in error messages. Every one returns
// Unknown for a value it cannot read (garbage, negative, NaN), so a
// provider's bad header never becomes a zero.

// RefTime is the instant absolute times in h are measured from: the
// response's Date header when it parses, else now.
func RefTime(h http.Header, now time.Time) time.Time {
	if v := h.Get("Date"); v != "" {
		if t, err := http.ParseTime(v); err == nil {
			return t
		}
	}
	return now
}

// ParseCount reads a non-negative integer count ("4999"; "14000.0" too).
func ParseCount(v string) int64 {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return Unknown // Azure's -1 means "not known"
		}
		return n
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || math.IsNaN(f) || f > math.MaxInt64/2 {
		return Unknown
	}
	return int64(f)
}

// ParseReset reads when a window refreshes, as a duration after ref:
//   - a Go duration, as OpenAI and Groq send ("20s", "2m59.56s", "172.8ms");
//   - plain seconds ("2", "33011.38", Together, Mistral, Cerebras);
//   - a Unix time in seconds or milliseconds (> 1e9; OpenRouter);
//   - an RFC 3339 instant (Anthropic) or an HTTP-date.
//
// An instant in the past is 0 (already refreshed); a wait longer than
// MaxCooldown is garbage (a Retry-After of 1e12), not advice, and
// reads as Unknown, so the router's own backoff applies.
func ParseReset(v string, ref time.Time) time.Duration {
	d, instant, _ := ParseResetInstant(v, ref)
	if instant && d < 0 {
		return 0
	}
	return d
}

// ParseResetInstant is ParseReset, and reports whether v named an
// instant (a Unix time, RFC 3339, an HTTP-date) rather than a countdown,
// and its resolution: the unit its last digit counts (1 s for "8", "8s",
// "6m0s", Unix seconds, RFC 3339 without a fraction and HTTP-dates; 10 ms
// for "2m59.56s"; 0 below a millisecond), at most a second. A provider
// that rounds its reset to that unit, either way, puts the true one up to
// a unit from the stated one (see Window.Resolution). A countdown counts
// from when the provider admitted the request, some time between its send
// and its first byte (PROVIDERS.md); an instant is exact but for clock
// skew and its resolution (see Window.Instant). An instant that passed
// before ref is negative, how long before ref it was (down to
// -MaxCooldown; one older says nothing, 0): the window was full again
// then (see Window.Passed). Garbage (Inf, numbers past any Unix time in
// milliseconds) is Unknown, never 0.
func ParseResetInstant(v string, ref time.Time) (d time.Duration, instant bool, resolution time.Duration) {
	v = strings.TrimSpace(v)
	if v == "" {
		return Unknown, false, 0
	}
	if !durationEnd(v) { // strconv's error for a duration would be an allocation
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			switch {
			case math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e15:
				return Unknown, false, 0
			case f > 1e12:
				return instantWait(time.UnixMilli(int64(f)).Sub(ref)), true, digitUnit(v, time.Millisecond)
			case f > 1e9:
				return instantWait(time.Unix(int64(f), 0).Sub(ref)), true, digitUnit(v, time.Second)
			}
			return seconds(f), false, digitUnit(v, time.Second)
		}
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return Unknown, false, 0
		}
		return ClampWait(d), false, durationUnit(v)
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return instantWait(t.Sub(ref)), true, digitUnit(v, time.Second) // the only point is the fraction's
	}
	if t, err := http.ParseTime(v); err == nil {
		return instantWait(t.Sub(ref)), true, time.Second
	}
	return Unknown, false, 0
}

// durationEnd reports whether v ends as a Go duration does (its unit's
// last letter, "s", "m" or "h"), which no number strconv.ParseFloat reads
// does (those end in a digit, a point, "inf", "infinity" or "nan").
func durationEnd(v string) bool {
	switch v[len(v)-1] {
	case 's', 'm', 'h':
		return true
	}
	return false
}

// digitUnit is the resolution of a decimal number v counted in unit: unit
// itself without a fraction, a tenth of it per digit after the point;
// capped at a second, 0 below a millisecond.
func digitUnit(v string, unit time.Duration) time.Duration {
	if i := strings.IndexByte(v, '.'); i >= 0 {
		for _, c := range v[i+1:] {
			if c < '0' || c > '9' {
				break
			}
			unit /= 10
		}
	}
	switch {
	case unit < time.Millisecond:
		return 0
	case unit > time.Second:
		return time.Second
	}
	return unit
}

// durationUnit is the resolution of a Go duration ("6m0s": 1 s, "17ms":
// 1 ms, "2m59.56s": 10 ms): the unit of its last number, with its
// fraction's digits.
func durationUnit(v string) time.Duration {
	start := strings.LastIndexAny(v, "0123456789") + 1
	num := strings.LastIndexFunc(v[:start], func(r rune) bool { return (r < '0' || r > '9') && r != '.' }) + 1
	unit, ok := durationUnits[v[start:]]
	if !ok {
		return 0
	}
	return digitUnit(v[num:start], unit)
}

// durationUnits are the units time.ParseDuration reads, by their names.
var durationUnits = map[string]time.Duration{
	"ns": time.Nanosecond, "us": time.Microsecond, "µs": time.Microsecond, "μs": time.Microsecond,
	"ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour,
}

// seconds converts non-negative float seconds to a duration, Unknown past
// MaxCooldown.
func seconds(f float64) time.Duration {
	if math.IsInf(f, 0) || f*float64(time.Second) > float64(MaxCooldown) {
		return Unknown
	}
	return time.Duration(f * float64(time.Second))
}

// instantWait is an instant's wait d from ref as ParseResetInstant
// returns it: Unknown past MaxCooldown, d itself back to -MaxCooldown
// (passed: how long ago), 0 before that (too old to say anything).
func instantWait(d time.Duration) time.Duration {
	switch {
	case d > MaxCooldown:
		return Unknown
	case d < -MaxCooldown:
		return 0
	}
	return d
}

// ClampWait maps a past instant to 0 and an absurdly distant one to Unknown.
func ClampWait(d time.Duration) time.Duration {
	if d > MaxCooldown {
		return Unknown
	}
	return max(d, 0)
}

// RetryAfter reads retry-after-ms (Azure OpenAI, milliseconds) or
// Retry-After (RFC 9110: delay-seconds or an HTTP-date, read against the
// Date header). Unknown when neither is present or readable.
func RetryAfter(h http.Header, ref time.Time) time.Duration {
	if v := h.Get("Retry-After-Ms"); v != "" {
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && f >= 0 && !math.IsNaN(f) {
			return seconds(f / 1000)
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return Unknown
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f < 0 || math.IsNaN(f) {
			return Unknown
		}
		return seconds(f)
	}
	if t, err := http.ParseTime(v); err == nil {
		return ClampWait(t.Sub(ref))
	}
	return Unknown
}

// hintPrefixes introduce a wait in providers' error messages: OpenAI and Groq
// "Please try again in 125ms.", Azure "Please retry after 5 seconds.",
// Gemini "Please retry in 26.2s.".
var hintPrefixes = []string{"try again in ", "retry in ", "retry after "}

// MessageHint reads the wait an error message suggests, or Unknown.
func MessageHint(msg string) time.Duration {
	lower := strings.ToLower(msg)
	for _, p := range hintPrefixes {
		i := strings.Index(lower, p)
		if i < 0 {
			continue
		}
		if d := parseHint(lower[i+len(p):]); d >= 0 {
			return d
		}
	}
	return Unknown
}

// parseHint reads "125ms", "5.289s", "1m30s", "5 seconds", "2 minutes".
func parseHint(s string) time.Duration {
	end := 0
	for end < len(s) && (s[end] == '.' || s[end] >= '0' && s[end] <= '9' || s[end] >= 'a' && s[end] <= 'z') {
		end++
	}
	tok := strings.TrimSuffix(s[:end], ".")
	if d, err := time.ParseDuration(tok); err == nil && d >= 0 {
		return ClampWait(d)
	}
	f, err := strconv.ParseFloat(tok, 64)
	if err != nil || f < 0 || math.IsNaN(f) {
		return Unknown
	}
	unit := strings.TrimLeft(s[end:], " ")
	switch {
	case strings.HasPrefix(unit, "ms"), strings.HasPrefix(unit, "millisecond"):
		return seconds(f / 1000)
	case strings.HasPrefix(unit, "min"):
		return seconds(f * 60)
	case strings.HasPrefix(unit, "s"), strings.HasPrefix(unit, "sec"):
		return seconds(f)
	}
	return Unknown
}

// SetReset reads a stated reset v into w (Reset, Instant, Resolution and
// Passed; see ParseResetInstant), against ref (RefTime).
func (w *Window) SetReset(v string, ref time.Time) {
	d, instant, resolution := ParseResetInstant(v, ref)
	w.Reset, w.Instant, w.Resolution, w.Passed = d, instant, resolution, 0
	if instant && d < 0 {
		w.Reset, w.Passed = 0, -d
	}
}
