package fleet

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// fleetShare runs two consumers backlogged on one group's fleet queue
// from two instances: "batch" on the first keeps 10 requests waiting
// (10x), "chat" (of weight chatW) on the second keeps 1 (none when chatW
// is 0). The fleet serves its head serves times (the first member in the
// queue's order, as the fleet's turn lets it go: fleetTurn), and each
// consumer joins a request again for each of its own served. It returns
// chat's share of what was served. fair: the requests join with their
// consumer and weight (JoinAs), else by arrival (Join). Before the
// serves, chat has unserved of its requests join before its first, and
// leave unserved (LeaveUnserved: their deadlines passed while they
// waited).
func fleetShare(t testing.TB, url string, chatW float64, serves, unserved int, fair bool) float64 {
	t.Helper()
	var stores [2]*Store
	prefix := keyPrefixTB(t)
	for i := range stores {
		s, err := New(Options{URL: url, KeyPrefix: prefix, PollInterval: time.Hour, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores[i] = s
	}
	qs := [2]*Queue{stores[0].Queue("limited", []string{testIdentity}), stores[1].Queue("limited", []string{testIdentity})}
	who := map[string]string{}
	lastJoined := ""
	order := uint64(0)
	join := func(i int, consumer string, weight float64) {
		order++
		var m string
		var err error
		if fair {
			m, _, _, err = qs[i].JoinAs(consumer, weight, 5, 9, time.Now(), order, time.Minute, 10, false)
		} else {
			m, _, _, err = qs[i].Join(5, 9, time.Now(), order, time.Minute, 10, false)
		}
		if err != nil {
			t.Fatal(err)
		}
		who[m], lastJoined = consumer, m
	}
	for range 10 {
		join(0, "batch", 1)
	}
	if chatW > 0 {
		var left []string
		for range unserved {
			join(1, "chat", chatW)
			left = append(left, lastJoined)
		}
		join(1, "chat", chatW) // behind them: it moves up a turn for each
		for _, m := range left {
			qs[1].LeaveUnserved(m)
		}
	}
	opt, _ := redis.ParseURL(url)
	c := redis.NewClient(opt)
	defer c.Close()
	served := map[string]int{}
	for range serves {
		head, err := c.ZRange(context.Background(), qs[0].waiting, 0, 0).Result()
		if err != nil || len(head) != 1 {
			t.Fatalf("the queue's head: %v %v", head, err)
		}
		consumer := who[head[0]]
		served[consumer]++
		if consumer == "chat" {
			qs[1].Leave(head[0])
			join(1, "chat", chatW)
		} else {
			qs[0].Leave(head[0])
			join(0, "batch", 1)
		}
	}
	return float64(served["chat"]) / float64(serves)
}

// keyPrefixTB is keyPrefix for a test or a benchmark.
func keyPrefixTB(t testing.TB) string {
	if tt, ok := t.(*testing.T); ok {
		return keyPrefix(tt)
	}
	return "llm_router_bench:" + t.Name() + ":" + time.Now().Format("150405.000000000") + ":"
}

// Two consumers backlogged on one limited deployment across two
// instances get their weight's share of what the fleet's queue serves,
// as the local queue gives it (BenchmarkFairShare): one keeping 10x the
// other's requests waiting, 1:1 is 50/50 within 5% (by arrival, 9/91:
// the fleet's queue ordered by arrival alone), 3:1 is 75/25 within 5%,
// and with one idle the other gets it all.
func TestFleetQueueServesConsumersTheirFairShare(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		for _, c := range []struct {
			name  string
			chatW float64
			want  float64
		}{{"1:1", 1, 0.5}, {"3:1", 3, 0.75}, {"chat idle", 0, 0}} {
			got := fleetShare(t, url, c.chatW, 200, 0, true)
			t.Logf("%s: chat %.1f%% of 200 served", c.name, 100*got)
			if math.Abs(got-c.want) > 0.05 {
				t.Errorf("%s: expected chat %.0f%% within 5%%, got %.1f%%", c.name, 100*c.want, 100*got)
			}
		}
	})
}

// A consumer's requests that leave the fleet's queue unserved (their
// deadlines, their clients gone) give their turns back, as this
// instance's queue gives them (router/queue.go unspend): after 50 of
// chat's left unserved, chat and batch backlogged still get their
// weights' shares within 5%, its request that waited behind them moved up
// (chat was charged the 50 turns before: 37.5% at 1:1, 68% at 3:1, the
// first 50 and 17 serves all batch's).
func TestFleetQueueGivesBackTheTurnsOfRequestsThatLeaveUnserved(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		for _, c := range []struct {
			name  string
			chatW float64
			want  float64
		}{{"1:1", 1, 0.5}, {"3:1", 3, 0.75}} {
			got := fleetShare(t, url, c.chatW, 200, 50, true)
			t.Logf("%s: chat %.1f%% of 200 served after 50 of its requests left unserved", c.name, 100*got)
			if math.Abs(got-c.want) > 0.05 {
				t.Errorf("%s: expected chat %.0f%% within 5%%, got %.1f%%", c.name, 100*c.want, 100*got)
			}
		}
	})
}

// A consumer that had nothing waiting starts at the fleet's virtual time
// (the start of the last request served from the head), with no credit for
// its idle time: after batch alone was served 50 times (5 left waiting),
// chat's first request goes first, its second and third each after one
// more of batch's (by arrival: behind all 5).
func TestFleetQueueIdleConsumerStartsAtTheVirtualTime(t *testing.T) {
	url := realRedisURL(t)
	a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
	qa, qb := a.store.Queue("limited", []string{testIdentity}), b.store.Queue("limited", []string{testIdentity})
	var batch []string
	for i := range 55 {
		m, _, _, err := qa.JoinAs("batch", 1, 5, 9, time.Now(), uint64(i), time.Minute, 10, false)
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, m)
	}
	for _, m := range batch[:50] {
		qa.Leave(m)
	}
	// A Leave is sent in a's next batch, not waited for: a's next call
	// goes after them, so once it is answered the 50 have left.
	if n, _, err := qa.Ahead(batch[50], false); err != nil || n != 0 {
		t.Fatalf("after 50 of batch left: expected its 51st at the head, got %d ahead (%v)", n, err)
	}
	for i, want := range [][2]int64{{0, 0}, {1, 2}, {3, 4}} {
		m, _, _, err := qb.JoinAs("chat", 1, 5, 9, time.Now(), uint64(i), time.Minute, 10, false)
		if err != nil {
			t.Fatal(err)
		}
		if n, _, err := qb.Ahead(m, false); err != nil || n < want[0] || n > want[1] {
			t.Errorf("chat's request %d: expected %d to %d ahead, got %d (%v)", i+1, want[0], want[1], n, err)
		}
	}
}

// BenchmarkFleetFairShare is BenchmarkFairShare's scenario on the fleet's
// queue: two instances, "batch" keeping 10x "chat"'s requests waiting, 200
// served by the queue's order; it reports chat's share (chat_%) with the
// consumers' fair tags (fair) and by arrival (arrival, as before), on a
// real redis-server when one is there (else miniredis).
func BenchmarkFleetFairShare(b *testing.B) {
	url, _ := benchRedis(b)
	for _, c := range []struct {
		name  string
		chatW float64
	}{{"equal-weights", 1}, {"weights-1:3", 3}, {"chat-idle", 0}} {
		for _, fair := range []bool{true, false} {
			name := c.name + "/fair"
			if !fair {
				name = c.name + "/arrival"
			}
			b.Run(name, func(b *testing.B) {
				var got float64
				for range b.N {
					got = fleetShare(b, url, c.chatW, 200, 0, fair)
				}
				b.ReportMetric(100*got, "chat_%")
				b.ReportMetric(100*(1-got), "batch_%")
			})
		}
	}
}

// BenchmarkFleetLeaveUnservedBurst is a burst of 1,000 fair members of two
// consumers (a real redis-server when one is there) leaving unserved at
// once, as a burst told 429 does: their Leaves go in a batch or a few, and
// the turns they give back cost one pass over the queue per batch
// (fairGiveBack), not one per Leave. It reports the time from the first
// Leave until a look after the last is answered.
func BenchmarkFleetLeaveUnservedBurst(b *testing.B) {
	url, _ := benchRedis(b)
	s, err := New(Options{URL: url, KeyPrefix: keyPrefixTB(b), PollInterval: time.Hour, Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	q := s.Queue("limited", []string{testIdentity})
	const n = 1000
	for i := range b.N {
		b.StopTimer()
		joins := make([]Joining, n+1)
		for k := range joins {
			joins[k] = Joining{Consumer: []string{"batch", "chat"}[k%2], Weight: 1, Priority: 5, MaxPriority: 9,
				Arrival: time.Now(), Order: uint64(i*(n+1) + k), Wait: time.Minute, Tokens: 10}
		}
		q.JoinAll(joins)
		for _, j := range joins {
			if j.Err != nil {
				b.Fatal(j.Err)
			}
		}
		b.StartTimer()
		for _, j := range joins[:n] {
			q.LeaveUnserved(j.Member)
		}
		if _, _, err := q.Ahead(joins[n].Member, false); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		q.Leave(joins[n].Member)
		b.StartTimer()
	}
}
