package soak

import "testing"

// A short soak: the counts that must be zero are.
func TestSoakShort(t *testing.T) {
	o := DefaultOptions
	o.Requests, o.Concurrency, o.Port = 1500, 50, 9420
	res, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", res)
	// Truncated counts answers that ended as whole without the text the
	// providers wrote; Other, transport errors and unexpected statuses.
	if res.Surfaced429 != 0 || res.Overruns != 0 || res.Truncated != 0 || res.Other != 0 {
		t.Errorf("expected no 429, overrun, truncated success or other outcome; got %d, %d, %d, %d", res.Surfaced429, res.Overruns, res.Truncated, res.Other)
	}
	if res.Successes < res.Requests*8/10 {
		t.Errorf("expected most requests answered, got %d of %d", res.Successes, res.Requests)
	}
	if res.GoroutinesPost > res.GoroutinesPre+5 {
		t.Errorf("goroutines leaked: %d before Caddy started, %d after it stopped", res.GoroutinesPre, res.GoroutinesPost)
	}
}
