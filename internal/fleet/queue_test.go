package fleet

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// The fleet's queue counts each waiting request's place across instances:
// a higher priority first, then the earlier arrival; a request that left
// counts no more, and one whose instance died stops counting once its time
// is past.
func TestFleetQueueCountsPlacesAcrossInstances(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		qa, qb := a.store.Queue("limited"), b.store.Queue("limited")
		t0 := time.Now()
		join := func(q *Queue, priority int, at time.Duration, wait time.Duration) string {
			t.Helper()
			m, err := q.Join(priority, 9, t0.Add(at), wait)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		first := join(qa, 5, 0, time.Minute)
		second := join(qb, 5, time.Millisecond, time.Minute)
		third := join(qa, 5, 2*time.Millisecond, time.Minute)
		urgent := join(qb, 8, 3*time.Millisecond, time.Minute)
		for _, c := range []struct {
			q      *Queue
			member string
			want   int64
		}{{qa, urgent, 0}, {qb, first, 1}, {qa, second, 2}, {qb, third, 3}} {
			if n, err := c.q.Ahead(c.member); err != nil || n != c.want {
				t.Errorf("expected %d ahead, got %d (%v)", c.want, n, err)
			}
		}
		qb.Leave(urgent)
		qa.Leave(first)
		if n, _ := qa.Ahead(third); n != 1 {
			t.Errorf("after two left: expected 1 ahead of the third, got %d", n)
		}
		if _, err := qa.Ahead(first); err == nil {
			t.Error("expected no place for a request that left")
		}
		// Another group's queue is another queue.
		if n, _ := a.store.Queue("other").Ahead(third); n != 0 {
			t.Errorf("expected nothing of another group, got %d", n)
		}
		if m == nil {
			return // real Redis: its clock is not ours to move
		}
		// An instance that died leaves its requests behind: they stop
		// counting once their wait (and a second) is past.
		gone := join(qb, 9, -time.Second, 100*time.Millisecond)
		if n, _ := qa.Ahead(third); n != 2 {
			t.Errorf("expected the dead instance's request ahead, got %d", n)
		}
		m.SetTime(time.Now().Add(5 * time.Second))
		join(qa, 0, time.Second, time.Minute) // any join sweeps
		if n, _ := qa.Ahead(third); n != 1 {
			t.Errorf("expected the dead instance's request swept (%s), got %d ahead", gone, n)
		}
	})
}
