package fleet

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// The fleet's queue counts each waiting request's place across instances:
// a higher priority first, then the earlier arrival; a request that left
// counts no more, and one whose instance died stops counting once its time
// is past.
func TestFleetQueueCountsPlacesAcrossInstances(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		// Leases that outlast the clock's jump below: here a request's own
		// expiry is tested (TestFleetQueueForgetsWhatIsGone tests leases).
		a.store.lease, b.store.lease = time.Minute, time.Minute
		qa, qb := a.store.Queue("limited", []string{testIdentity}), b.store.Queue("limited", []string{testIdentity})
		t0 := time.Now()
		order := uint64(0)
		join := func(q *Queue, priority int, at time.Duration, wait time.Duration) string {
			t.Helper()
			order++
			m, _, _, err := q.Join(priority, 9, t0.Add(at), order, wait, 10, false)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		first := join(qa, 5, 0, time.Minute)
		second := join(qb, 5, time.Millisecond, time.Minute)
		third := join(qa, 5, 2*time.Millisecond, time.Minute)
		urgent := join(qb, 8, 3*time.Millisecond, time.Minute)
		// Join tells the place it took.
		if _, n, tok, err := qa.Join(5, 9, t0.Add(4*time.Millisecond), 100, time.Minute, 7, true); err != nil || n != 4 || tok != 40 {
			t.Errorf("expected the fifth joined 4th in line behind 40 tokens, got %d and %d (%v)", n, tok, err)
		}
		for _, c := range []struct {
			q      *Queue
			member string
			want   int64
		}{{qa, urgent, 0}, {qb, first, 1}, {qa, second, 2}, {qb, third, 3}} {
			if n, tok, err := c.q.Ahead(c.member, true); err != nil || n != c.want || tok != 10*c.want {
				t.Errorf("expected %d ahead with %d tokens, got %d and %d (%v)", c.want, 10*c.want, n, tok, err)
			}
		}
		qb.Leave(urgent)
		qa.Leave(first)
		// A Leave is not waited for: the instance's next call follows it.
		if _, _, err := qb.Ahead(urgent, false); !errors.Is(err, ErrNotQueued) {
			t.Errorf("expected the urgent request out once its instance's next call is answered, got %v", err)
		}
		if n, tok, _ := qa.Ahead(third, true); n != 1 || tok != 10 {
			t.Errorf("after two left: expected 1 ahead of the third (10 tokens), got %d (%d)", n, tok)
		}
		if _, _, err := qa.Ahead(first, false); !errors.Is(err, ErrNotQueued) {
			t.Error("expected no place for a request that left")
		}
		// One instance's requests of one millisecond are in its own order
		// of arrival, whatever order they joined the fleet's queue in
		// (their Joins race): the later arrival joined first here.
		same := t0.Add(10 * time.Millisecond)
		later, _, _, err := qa.Join(5, 9, same, 201, time.Minute, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		earlier, _, _, err := qa.Join(5, 9, same, 200, time.Minute, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		nl, _, _ := qa.Ahead(later, false)
		ne, _, _ := qa.Ahead(earlier, false)
		if ne+1 != nl {
			t.Errorf("expected the earlier arrival just ahead of the later one, got %d and %d ahead", ne, nl)
		}
		qa.Leave(later)
		qa.Leave(earlier)
		// Another group's queue is another queue.
		if _, _, err := a.store.Queue("other", []string{testIdentity}).Ahead(third, false); !errors.Is(err, ErrNotQueued) {
			t.Errorf("expected nothing of another group, got %v", err)
		}
		if _, _, err := a.store.Queue("limited", []string{"another deployment"}).Ahead(third, false); !errors.Is(err, ErrNotQueued) {
			t.Errorf("expected nothing of a group of that name with other deployments, got %v", err)
		}
		if a.store.Queue("limited", []string{testIdentity, testIdentity}) != qa {
			t.Error("expected one queue per group and deployments")
		}
		if m == nil {
			return // real Redis: its clock is not ours to move
		}
		// An instance that died leaves its requests behind: they stop
		// counting once their wait (and a second) is past.
		gone := join(qb, 9, -time.Second, 100*time.Millisecond)
		if n, _, _ := qa.Ahead(third, false); n != 2 {
			t.Errorf("expected the dead instance's request ahead, got %d", n)
		}
		m.SetTime(time.Now().Add(5 * time.Second))
		join(qa, 0, time.Second, time.Minute) // any join sweeps
		if n, _, _ := qa.Ahead(third, false); n != 1 {
			t.Errorf("expected the dead instance's request swept (%s), got %d ahead", gone, n)
		}
	})
}

// A request whose instance is gone stops counting soon, wherever it went:
// its instance closed (a graceful stop, the last config using the store
// unloaded) takes its members out; one killed (or cut from Redis) loses
// them once its lease, renewed at each poll, runs out; a Leave that Redis
// did not confirm is done at the next poll.
func TestFleetQueueForgetsWhatIsGone(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a := newInstance(t, url, time.Hour, 0, 0)
		b := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
		ids := []string{testIdentity}
		qa, qb := a.store.Queue("limited", ids), b.store.Queue("limited", ids)
		t0 := time.Now()
		order := uint64(0)
		join := func(q *Queue, at time.Duration) string {
			t.Helper()
			order++
			m, _, _, err := q.Join(5, 9, t0.Add(at), order, time.Hour, 0, false)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		ahead := func(q *Queue, member string) int64 {
			t.Helper()
			n, _, err := q.Ahead(member, false)
			if err != nil {
				t.Fatalf("Ahead: %v", err)
			}
			return n
		}

		// A Leave while the store is marked down is done at the next poll.
		a1 := join(qa, 0)
		b1 := join(qb, time.Millisecond)
		a.store.health.Store(healthDown)
		qa.Leave(a1)
		if n := ahead(qb, b1); n != 1 {
			t.Fatalf("expected the unconfirmed Leave still counted, got %d ahead", n)
		}
		a.store.health.Store(healthUp)
		if err := a.store.renewQueues(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := ahead(qb, b1); n != 0 {
			t.Errorf("expected the Leave done at the next poll, got %d ahead", n)
		}

		// A closed instance (a reload that drops its store) keeps the
		// places of its requests still waiting until they leave, then
		// takes out what is left.
		c := newInstance(t, url, time.Hour, 0, 0)
		qc := c.store.Queue("limited", ids)
		c1 := join(qc, -2*time.Millisecond)
		c2 := join(qc, -time.Millisecond)
		b2 := join(qb, 2*time.Millisecond)
		if n := ahead(qb, b2); n != 3 {
			t.Fatalf("expected 3 ahead, got %d", n)
		}
		if err := c.store.Close(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * queueLease) // its leases are still renewed
		if n := ahead(qb, b2); n != 3 {
			t.Errorf("expected the closed instance's waiting requests still counted, got %d ahead", n)
		}
		qc.Leave(c1)
		c.store.health.Store(healthDown) // c2's Leave goes unconfirmed...
		qc.Leave(c2)
		c.store.health.Store(healthUp)
		eventually(t, 5*time.Second, "the closed instance's leftover taken out", func() bool { return ahead(qb, b2) == 1 })

		// A killed instance (a, which renews no more: marked down) loses its
		// members once its lease runs out; b, which renews, keeps its own.
		a2 := join(qa, -time.Second)
		if n := ahead(qb, b2); n != 2 {
			t.Fatalf("expected 2 ahead, got %d", n)
		}
		a.store.health.Store(healthDown)
		time.Sleep(queueLease + 300*time.Millisecond)
		if n := ahead(qb, b2); n != 1 {
			t.Errorf("expected the killed instance's member swept, got %d ahead", n)
		}
		a.store.health.Store(healthUp)
		if _, _, err := qa.Ahead(a2, false); !errors.Is(err, ErrNotQueued) {
			t.Errorf("expected the swept member told it is not queued, got %v", err)
		}
	})
}

// Which deployment made a response is shared: one instance remembers it,
// another reads it; an unknown id is unknown.
func TestOwnersAreShared(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
		a.store.RememberOwner("resp_1", testIdentity, "p/model", "tag-1", time.Minute)
		a.store.RememberOwner("resp_2", "", "q/model", "", time.Minute)
		eventually(t, 5*time.Second, "the owner written", func() bool {
			_, _, _, ok := b.store.Owner("resp_2")
			return ok
		})
		if id, name, tag, ok := b.store.Owner("resp_1"); !ok || id != DeploymentID(testIdentity) || name != "p/model" || tag != "tag-1" {
			t.Errorf("expected resp_1 made by %s (p/model) for tag-1, got %q %q %q %v", DeploymentID(testIdentity), id, name, tag, ok)
		}
		if id, name, tag, ok := b.store.Owner("resp_2"); !ok || id != "" || name != "q/model" || tag != "" {
			t.Errorf("expected resp_2 translated by q/model, no tag, got %q %q %q %v", id, name, tag, ok)
		}
		if _, _, _, ok := b.store.Owner("resp_unknown"); ok {
			t.Error("expected an unknown response unknown")
		}
	})
}

// A budget call that times out while Redis answered others after it began
// is load, not an outage: refused for a moment, not decided on local
// state; one that times out with no answer since it began is a stall.
func TestBusyIsNotDown(t *testing.T) {
	s := &Store{}
	s.health.Store(healthUp)
	timeout := fmt.Errorf("spend: %w", context.DeadlineExceeded)
	start := time.Now().Add(-time.Millisecond)
	if s.busy(timeout, start) {
		t.Error("expected no answer yet to mean down, not busy")
	}
	s.answered()
	if !s.busy(timeout, start) || !s.busy(redis.ErrPoolTimeout, start) {
		t.Error("expected a timeout with an answer since the call began to be busy")
	}
	if s.busy(errors.New("connection refused"), start) {
		t.Error("expected a refused connection not to be busy")
	}
	s.health.Store(healthDown)
	if s.busy(timeout, start) {
		t.Error("expected a store known down not to be busy")
	}
	s.health.Store(healthUp)
	if s.busy(timeout, time.Now().Add(time.Millisecond)) {
		t.Error("expected a timeout with no answer since the call began not to be busy")
	}
}

// A budget's spending is one total for the fleet, which expires after
// its window.
func TestFleetSpending(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
		ctx := context.Background()
		if total, err := a.store.AddSpend(ctx, "budget:group|g:42", 1.25, capacity.SpendOp{Writer: "a", Seq: 1}, time.Minute); err != nil || total != 1.25 {
			t.Fatalf("a: %v %v", total, err)
		}
		if total, err := b.store.AddSpend(ctx, "budget:group|g:42", 0.5, capacity.SpendOp{Writer: "b", Seq: 1}, time.Minute); err != nil || total != 1.75 {
			t.Errorf("b: %v %v", total, err)
		}
		if v, err := a.store.Spend(ctx, "budget:group|g:42"); err != nil || v != 1.75 {
			t.Errorf("read: %v %v", v, err)
		}
		if v, err := a.store.Spend(ctx, "budget:group|g:43"); err != nil || v != 0 {
			t.Errorf("another window: %v %v", v, err)
		}
		if m != nil {
			m.FastForward(2 * time.Minute)
			if v, _ := a.store.Spend(ctx, "budget:group|g:42"); v != 0 {
				t.Errorf("after its window: %v", v)
			}
		}
	})
}
