package soak

import "testing"

// A short soak, twice: with broken streams resumed (resume any, the
// default) and without (resume off). Both keep the counts that must be
// zero at zero; resuming must spare clients most in-band errors.
func TestSoakShort(t *testing.T) {
	run := func(resume string, port int) *Result {
		t.Helper()
		o := DefaultOptions
		o.Requests, o.Concurrency, o.Port, o.Resume = 1500, 50, port, resume
		res, err := Run(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("resume %s:\n%s", resume, res)
		// Truncated counts answers that ended as whole without the text the
		// providers wrote; Other, transport errors and unexpected statuses.
		if res.Surfaced429 != 0 || res.Overruns != 0 || res.Truncated != 0 || res.Other != 0 {
			t.Errorf("resume %s: expected no 429, overrun, truncated success or other outcome; got %d, %d, %d, %d",
				resume, res.Surfaced429, res.Overruns, res.Truncated, res.Other)
		}
		if res.Successes < res.Requests*8/10 {
			t.Errorf("resume %s: expected most requests answered, got %d of %d", resume, res.Successes, res.Requests)
		}
		if res.GoroutinesPost > res.GoroutinesPre+5 {
			t.Errorf("resume %s: goroutines leaked: %d before Caddy started, %d after it stopped", resume, res.GoroutinesPre, res.GoroutinesPost)
		}
		return res
	}
	off := run("off", 9430)
	on := run("any", 9420)

	// Without resume, the cut, error_event, stall and malformed faults
	// reach clients as in-band errors: about one stream in twenty.
	if off.Continuations != 0 {
		t.Errorf("resume off: expected no continuation, got %d", off.Continuations)
	}
	if off.InBandErrors < off.Requests/50 {
		t.Errorf("resume off: expected the stream faults to surface (at least %d in-band errors), got %d", off.Requests/50, off.InBandErrors)
	}
	// With it, most are taken up by a continuation or a replay.
	if on.Continuations == 0 {
		t.Error("resume any: expected continuations of broken streams, got none")
	}
	if on.InBandErrors*2 >= off.InBandErrors {
		t.Errorf("expected resume to spare clients most in-band errors: %d with resume any, %d with resume off", on.InBandErrors, off.InBandErrors)
	}
}
