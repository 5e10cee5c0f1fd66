package fleet

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// Two instances under a declared rpm of 40. Instance a's demand (50
// attempts at once) gets it a grant of places, of which it uses 1;
// instance b uses what the minute has left, and its next attempt finds
// none. Since a's grant, still in use, would hold it if a does not use
// it, b is told to try again within leaseSliceRetry (it was told to wait
// ~60 s, until the minute frees, for a place a never used); once a's
// grant ends and goes back (a's lease loop gives back what it did not
// use), b's next try starts, within its deadline.
func TestADeclaredRefusalWaitsForAnotherInstancesPlaces(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		bs := patientBindings(t, url, 2)
		a, b := bs[0], bs[1]
		const rpm = 40
		now := time.Now()
		for range 50 {
			a.places.want(now, 0)
		}
		if wait, err := a.Reserve(rpm, 0, 0); err != nil || wait != 0 {
			t.Fatalf("a's attempt: expected it started, got wait %v (%v)", wait, err)
		}
		started, wait := 0, time.Duration(0)
		for range 100 {
			var err error
			if wait, err = b.Reserve(rpm, 0, 0); err != nil {
				t.Fatal(err)
			}
			if wait != 0 {
				break
			}
			started++
		}
		var used, unused int64
		a.places.mu.Lock()
		for _, g := range a.places.grants {
			used, unused = used+g.used, unused+g.n-g.used
		}
		a.places.mu.Unlock()
		if unused <= 0 || int64(started)+used+unused != rpm {
			t.Fatalf("expected a's grant to hold what b could not use (the test needs it): a's used %d, unused %d, b started %d", used, unused, started)
		}
		if wait <= 0 || wait > leaseSliceRetry {
			t.Errorf("expected b told to try again within %v while a's grant holds %d unused, got wait %v", leaseSliceRetry, unused, wait)
		}
		deadline := time.Now().Add(declaredUse + 3*time.Second)
		for {
			w, err := b.Reserve(rpm, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if w == 0 {
				break
			}
			if time.Now().Add(w).After(deadline) {
				t.Fatalf("expected b started within %v once a's unused places came back, told to wait %v", declaredUse+3*time.Second, w)
			}
			time.Sleep(w)
		}
	})
}
