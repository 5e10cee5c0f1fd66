package fleet

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// Two instances on a stated window of 40 requests per 30 s. Instance a's
// demand (50 attempts at once) leases it a slice of the window, of which
// it spends 1; instance b spends what the window has unleased, and its
// next attempt finds none. Since a's unspent slice would hold it, b is
// told to try again within leaseSliceRetry (it was told to wait until the
// window renews, ~30 s, for a request a's slice still held); once a gives
// its slice back (a's Close), b's next try is served.
func TestARefusalWaitsForAnotherInstancesWindowSlice(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		bs := patientBindings(t, url, 2)
		a, b := bs[0], bs[1]
		bu := capacity.Budget{Requests: statedWindow(40, 30*time.Second), Tokens: capacity.BudgetWindow{Limit: -1}}
		now := time.Now()
		for range 50 {
			a.lease.want(now, needs(bu), bu)
		}
		if wait, _, err := a.Spend(bu); err != nil || wait != 0 {
			t.Fatalf("a's attempt: expected it served, got wait %v (%v)", wait, err)
		}
		served, wait := 0, time.Duration(0)
		for range 100 {
			var err error
			if wait, _, err = b.Spend(bu); err != nil {
				t.Fatal(err)
			}
			if wait != 0 {
				break
			}
			served++
		}
		held := a.lease.all(time.Now())[0]
		if held <= 0 || served+1+int(held) != 40 {
			t.Fatalf("expected a's slice to hold what b could not spend (the test needs it): a holds %d, b served %d", held, served)
		}
		if wait <= 0 || wait > leaseSliceRetry {
			t.Errorf("expected b told to try again within %v while a's slice holds %d, got wait %v", leaseSliceRetry, held, wait)
		}
		eventually(t, 2*time.Second, "a's slice given back", func() bool {
			a.upkeep(time.Now(), true) // as a's Close: its slice goes back (unless its lease loop's call is in flight)
			return a.lease.all(time.Now())[0] == 0
		})
		if wait, _, err := b.Spend(bu); err != nil || wait != 0 {
			t.Errorf("expected b served once a's slice came back, got wait %v (%v)", wait, err)
		}
	})
}
