package provider

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseReset(t *testing.T) {
	ref := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"20s":                  20 * time.Second,
		"2m59.56s":             179560 * time.Millisecond,
		"6m0s":                 6 * time.Minute,
		"172.799999ms":         172799999 * time.Nanosecond,
		"2":                    2 * time.Second,
		"33011.375":            33011375 * time.Millisecond,
		"2025-08-21T12:40:07Z": 7 * time.Second,
		"1755780030":           30 * time.Second, // Unix seconds
		"1755780030000":        30 * time.Second, // Unix milliseconds
		"2025-08-21T12:39:00Z": 0,                // in the past: already refreshed
		"9999h":                Unknown,          // past 24 h: garbage
		"99999999999s":         Unknown,          // overflows: garbage
		"-5":                   Unknown,
		"-5s":                  Unknown,
		"NaN":                  Unknown,
		"soon":                 Unknown,
		"":                     Unknown,
	} {
		if got := ParseReset(in, ref); got != want {
			t.Errorf("ParseReset(%q): expected %v, got %v", in, want, got)
		}
	}
}

// A countdown is not an instant: the router anchors the one and not the
// other.
func TestParseResetInstant(t *testing.T) {
	ref := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	for in, want := range map[string]bool{
		"20s": false, "2": false, "33011.375": false, "17ms": false,
		"2025-08-21T12:40:07Z": true, "1755780030": true, "1755780030000": true,
		"Thu, 21 Aug 2025 12:40:30 GMT": true, "soon": false,
	} {
		if _, got, _ := ParseResetInstant(in, ref); got != want {
			t.Errorf("ParseResetInstant(%q): instant %v, want %v", in, got, want)
		}
	}
}

// A reset's resolution is the unit of its last digit, at most a second:
// a provider that rounds to it may be up to that far off.
func TestParseResetResolution(t *testing.T) {
	ref := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"8": time.Second, "8s": time.Second, "6m0s": time.Second, "1h30m": time.Second,
		"8.5": 100 * time.Millisecond, "2m59.56s": 10 * time.Millisecond, "17ms": time.Millisecond,
		"172.799999ms": 0, "33011.375": time.Millisecond,
		"2025-08-21T12:40:07Z": time.Second, "2025-08-21T12:40:07.25Z": 10 * time.Millisecond,
		"2025-08-21T12:40:07.123456Z": 0, "1755780030": time.Second, "1755780030000": time.Millisecond,
		"Thu, 21 Aug 2025 12:40:30 GMT": time.Second,
	} {
		if _, _, got := ParseResetInstant(in, ref); got != want {
			t.Errorf("ParseResetInstant(%q): resolution %v, want %v", in, got, want)
		}
	}
}

// Garbage numbers are no reset: never 0 (already refreshed).
func TestGarbageResetsAreUnknown(t *testing.T) {
	ref := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	for _, in := range []string{"Inf", "+Inf", "1e308", "9999999999999999999999", "9223372036854775807"} {
		if got := ParseReset(in, ref); got != Unknown {
			t.Errorf("ParseReset(%q): expected Unknown, got %v", in, got)
		}
	}
}

func TestMessageHint(t *testing.T) {
	for msg, want := range map[string]time.Duration{
		"Please try again in 125ms.":     125 * time.Millisecond,
		"Please try again in 5.289s.":    5289 * time.Millisecond,
		"Please retry after 5 seconds.":  5 * time.Second,
		"Please retry in 26.211922938s.": 26211922938 * time.Nanosecond,
		"Please try again in 1m30s.":     90 * time.Second,
		"Please try again in 2 minutes.": 2 * time.Minute,
		"You have been rate limited.":    Unknown,
		"Please try again in a moment.":  Unknown,
		"retry in -4s":                   Unknown,
	} {
		if got := MessageHint(msg); got != want {
			t.Errorf("MessageHint(%q): expected %v, got %v", msg, want, got)
		}
	}
}

func TestSSEReader(t *testing.T) {
	in := ": hello\r\n\r\nevent: message_start\ndata: {\"a\":1}\n\ndata: line1\ndata: line2\n\nid: 7\n\ndata: last\n\n"
	r := NewSSEReader(strings.NewReader(in))
	var got []string
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		prefix := ev.Name
		if ev.Comment {
			prefix = "comment"
		}
		got = append(got, prefix+"|"+string(ev.Data))
	}
	want := []string{"comment|hello", "message_start|{\"a\":1}", "|line1\nline2", "|last"}
	if strings.Join(got, ";") != strings.Join(want, ";") {
		t.Errorf("expected %q, got %q", want, got)
	}

	// Cut inside an event, or inside a line: an unexpected EOF, never a clean end.
	for _, cut := range []string{"data: {\"a\":1}\n", "data: {\"a\":"} {
		r := NewSSEReader(strings.NewReader(cut))
		if _, err := r.Next(); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%q: expected io.ErrUnexpectedEOF, got %v", cut, err)
		}
	}
	// An endless line is bounded.
	r = NewSSEReader(io.LimitReader(infinite{}, 4*MaxEventSize))
	if _, err := r.Next(); !errors.Is(err, ErrEventTooLarge) {
		t.Errorf("expected ErrEventTooLarge, got %v", err)
	}
}

type infinite struct{}

func (infinite) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// What AppendEvent writes, the SSE reader reads back as it was; WriteEvent
// writes the same.
func TestAppendEventRoundTrip(t *testing.T) {
	var out []byte
	out = AppendEvent(out, "message_start", []byte(`{"a":1}`))
	out = AppendEvent(out, "", []byte("line1\nline2"))
	var w bytes.Buffer
	if WriteEvent(&w, "message_start", []byte(`{"a":1}`)) != nil || WriteEvent(&w, "", []byte("line1\nline2")) != nil ||
		w.String() != string(out) {
		t.Errorf("WriteEvent wrote %q, AppendEvent %q", w.String(), out)
	}
	if string(out) != "event: message_start\ndata: {\"a\":1}\n\ndata: line1\ndata: line2\n\n" {
		t.Errorf("unexpected frames %q", out)
	}
	r := NewSSEReader(bytes.NewReader(out))
	ev, err := r.Next()
	if err != nil || ev.Name != "message_start" || string(ev.Data) != `{"a":1}` {
		t.Errorf("expected the first event back, got %+v %v", ev, err)
	}
	ev, err = r.Next()
	if err != nil || ev.Name != "" || string(ev.Data) != "line1\nline2" {
		t.Errorf("expected the second event back, got %+v %v", ev, err)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Errorf("expected the end, got %v", err)
	}
}

// FuzzParseReset: any reset value reads as Unknown or a bounded wait, and
// a passed instant as a bounded Passed with Reset 0.
func FuzzParseReset(f *testing.F) {
	for _, s := range []string{"20s", "2m59.56s", "172.799999ms", "2", "33011.38", "2025-08-21T12:40:07Z",
		"1755780030", "1755780030000", "Thu, 21 Aug 2025 12:40:42 GMT", "-5", "NaN", "1e400", ""} {
		f.Add(s)
	}
	ref := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		if d := ParseReset(v, ref); d < Unknown || d > MaxCooldown {
			t.Fatalf("ParseReset(%q) = %v out of bounds", v, d)
		}
		w := UnknownWindow
		w.SetReset(v, ref)
		if w.Reset < Unknown || w.Reset > MaxCooldown || w.Passed < 0 || w.Passed > MaxCooldown || w.Passed > 0 && w.Reset != 0 {
			t.Fatalf("SetReset(%q): Reset %v, Passed %v out of bounds", v, w.Reset, w.Passed)
		}
		if d := MessageHint("Please try again in " + v); d < Unknown || d > MaxCooldown {
			t.Fatalf("MessageHint(%q) = %v out of bounds", v, d)
		}
	})
}

// An event's name cannot carry a line break (it would begin fields of its
// own for the client), and CR, LF and CRLF each end a data line, as the
// client's reader splits them.
func TestAppendEventKeepsOneEvent(t *testing.T) {
	out := AppendEvent(nil, "ping\n\nevent: message_stop\r", []byte("a\rb\r\nc\nd"))
	if string(out) != "event: pingevent: message_stop\ndata: a\ndata: b\ndata: c\ndata: d\n\n" {
		t.Errorf("frames %q", out)
	}
	r := NewSSEReader(bytes.NewReader(out))
	if ev, err := r.Next(); err != nil || ev.Name != "pingevent: message_stop" || string(ev.Data) != "a\nb\nc\nd" {
		t.Errorf("read back %+v %v", ev, err)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Errorf("expected one event, then the end: %v", err)
	}
}

// durationUnits names every unit time.ParseDuration reads, as it reads
// them: the resolution of a reset is its last number's unit.
func TestDurationUnitsAreParseDurations(t *testing.T) {
	for name, unit := range durationUnits {
		if d, err := time.ParseDuration("1" + name); err != nil || d != unit {
			t.Errorf("%q: %v, time.ParseDuration says %v %v", name, unit, d, err)
		}
	}
	for _, in := range []string{"1ns", "1us", "1µs", "1μs", "1ms", "1s", "1m", "1h"} {
		if _, ok := durationUnits[in[1:]]; !ok {
			t.Errorf("%q: a unit time.ParseDuration reads is missing", in)
		}
	}
}

// An instant that had passed when the answer was given (Anthropic's
// whole-second instants, read after a long generation) still says when
// the window was full again: it is kept, as how long before the Date it
// was, for the capacity state to anchor, not read as "full now". One
// older than any wait (a Unix time of 2001) says nothing.
func TestAPassedInstantIsKept(t *testing.T) {
	ref := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"2025-08-21T12:39:58Z": 2 * time.Second, "2025-08-21T12:39:59.75Z": 250 * time.Millisecond,
		"1755780000": 0, "1755779990000": 10 * time.Second, "Thu, 21 Aug 2025 12:39:30 GMT": 30 * time.Second,
		"2025-08-21T12:40:07Z": 0, "1000000001": 0, "5s": 0,
	} {
		if d, _, _ := ParseResetInstant(in, ref); d != -want && want > 0 {
			t.Errorf("ParseResetInstant(%q) = %v, want -%v (how long before ref)", in, d, want)
		}
		w := UnknownWindow
		w.SetReset(in, ref)
		if w.Passed != want {
			t.Errorf("SetReset(%q): Passed %v, want %v", in, w.Passed, want)
		}
		if w.Reset != ParseReset(in, ref) || w.Reset < 0 {
			t.Errorf("SetReset(%q): Reset %v, want ParseReset's %v (never negative)", in, w.Reset, ParseReset(in, ref))
		}
	}
	if d := ParseReset("2025-08-21T12:39:58Z", ref); d != 0 {
		t.Errorf("ParseReset of a passed instant = %v, want 0 (already refreshed)", d)
	}
}
