package fleet

import (
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// 64 requests waiting at once on each of two instances, each joining the
// fleet's queue, looking at its place twice and leaving: an instance's
// queue calls that meet are sent as one script call, so the queue costs
// under 1 Redis command per waiting request (7 to 9 before: a script per
// Join and per look, a 5-command transaction per Leave), and each request
// still reads a true place.
func TestFleetQueueCallsAreBatched(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		// A Timeout that a loaded machine's miniredis meets: the batching is
		// tested here (TestRedisStallHoldsNoRequestPastTimeout the bound).
		a, b := newInstanceTimeout(t, url, time.Hour, 0, 0, 5*time.Second), newInstanceTimeout(t, url, time.Hour, 0, 0, 5*time.Second)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
		ca, cb := spendCommands(a), spendCommands(b)
		const n = 64
		var start, joined, looked sync.WaitGroup
		start.Add(1)
		joined.Add(2 * n)
		looked.Add(2 * n)
		var wg sync.WaitGroup
		errs := make(chan error, 4*n)
		t0 := time.Now()
		for i := range 2 * n {
			q := []*Queue{a.store.Queue("limited", []string{testIdentity}), b.store.Queue("limited", []string{testIdentity})}[i%2]
			wg.Go(func() {
				start.Wait()
				m, _, _, err := q.Join(5, 9, t0.Add(time.Duration(i)*time.Millisecond), uint64(i), time.Minute, 10, true)
				joined.Done()
				if err != nil {
					errs <- err
					looked.Done()
					return
				}
				joined.Wait() // all of them in the queue: the place is the arrival's
				for range 2 {
					ahead, tok, err := q.Ahead(m, true)
					if err != nil || ahead != int64(i) || tok != 10*int64(i) {
						t.Errorf("request %d: expected %d ahead with %d tokens, got %d and %d (%v)", i, i, 10*i, ahead, tok, err)
					}
				}
				looked.Done()
				looked.Wait()
				q.Leave(m)
			})
		}
		start.Done()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		cmds := ca.n.Load() + cb.n.Load()
		t.Logf("%d Redis commands for %d waiting requests (%.2f each)", cmds, 2*n, float64(cmds)/(2*n))
		if float64(cmds)/(2*n) >= 1 {
			t.Errorf("expected under 1 Redis command per waiting request, got %d for %d", cmds, 2*n)
		}
		q := a.store.Queue("limited", []string{testIdentity})
		for _, q := range []*Queue{q, b.store.Queue("limited", []string{testIdentity})} {
			_, _, _ = q.Ahead("none", false) // after the Leaves, which are not waited for
		}
		if n, err := a.store.client.ZCard(t.Context(), q.waiting).Result(); err != nil || n != 0 {
			t.Errorf("expected the queue empty once all left, got %d (%v)", n, err)
		}
	})
}
