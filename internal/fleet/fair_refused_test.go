package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// A request at the head of the fleet's queue leaves it served to claim
// capacity (router's take), its claim is refused (a half-open probe taken
// meanwhile, the fleet's budget) and it joins again with GiveBack: it is
// back at the head, with the turn it had, three times over, whether its
// consumer has another request waiting behind it or not; once served,
// its consumer's next request is charged one turn, not four (without the
// give-back each rejoin took a new turn: 2 and 3 ahead after three
// refusals, its next request starting 3 turns later).
func TestARefusedClaimKeepsItsFleetTurn(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		opt, _ := redis.ParseURL(url)
		cl := redis.NewClient(opt)
		defer cl.Close()
		for _, behind := range []int{0, 1} {
			a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
			group := "limited" + string(rune('a'+behind))
			qa, qb := a.store.Queue(group, []string{testIdentity}), b.store.Queue(group, []string{testIdentity})
			order := uint64(0)
			join := func(q *Queue, consumer string, giveBack bool) (string, int64) {
				t.Helper()
				order++
				j := []Joining{{Consumer: consumer, Weight: 1, Priority: 5, MaxPriority: 9, Arrival: time.Now(), Order: order,
					Wait: time.Minute, Tokens: 10, GiveBack: giveBack}}
				q.JoinAll(j)
				if j[0].Err != nil {
					t.Fatal(j[0].Err)
				}
				return j[0].Member, j[0].Ahead
			}
			// batch: starts 0, 1, 2 (turns); its first served: the
			// virtual time 0. chat: 0 (the head), and 1 behind it.
			first, _ := join(qa, "batch", false)
			join(qa, "batch", false)
			join(qa, "batch", false)
			qa.Leave(first)
			eventually(t, 5*time.Second, "batch's first out", func() bool {
				return errors.Is(cl.ZScore(context.Background(), qa.waiting, first).Err(), redis.Nil)
			})
			head, ahead := join(qb, "chat", false)
			if ahead != 0 {
				t.Fatalf("behind %d: chat's first request %d ahead, expected the head", behind, ahead)
			}
			for range behind {
				join(qb, "chat", false)
			}
			for i := range 3 {
				qb.Leave(head) // to claim, served
				head, ahead = join(qb, "chat", true)
				if ahead != 0 {
					t.Errorf("behind %d: after refused claim %d, %d ahead, expected the head still", behind, i+1, ahead)
				}
			}
			qb.Leave(head) // claimed
			next, _ := join(qb, "chat", false)
			sc, err := cl.ZScore(context.Background(), qb.waiting, next).Result()
			if err != nil {
				t.Fatal(err)
			}
			if start, want := sc-placeBase(5, 9), float64((1+behind)*fairUnits); start != want {
				t.Errorf("behind %d: chat's next request starts at %v, expected %v: one turn charged for its request served", behind, start, want)
			}
		}
	})
}
