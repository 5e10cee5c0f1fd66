package router

import "time"

// FleetJoin is one request joining the fleet's queue (FleetQueue.JoinAll):
// what the fleet orders it by, then its answer.
type FleetJoin struct {
	// Consumer and Weight (more than 0 when consumers are configured)
	// place it among its priority by the consumer's fair share.
	Consumer string
	Weight   float64
	// Priority is the request's (MinPriority to MaxPriority), Arrival when
	// it arrived; Order numbers this instance's requests of the group in
	// the order they arrived, and orders those of one priority and arrival
	// time as this instance's own queue does, so that its head is never
	// counted behind requests queued after it here.
	Priority, MaxPriority int
	Arrival               time.Time
	Order                 uint64
	// Wait is the longest it waits (it stops counting then); Tokens its
	// estimate; WithTokens asks for the tokens of those before it.
	Wait       time.Duration
	Tokens     int64
	WithTokens bool
	// GiveBack gives its consumer's last turn in the fleet's fair order
	// back before it is tagged: it left the fleet's queue served to claim
	// capacity, and the claim was refused (take), so that it joins again
	// with the turn it had, not a second one.
	GiveBack bool
	// The answer: Member names it (for Ahead and Leave), Ahead is how many
	// wait before it fleet-wide and TokensAhead (WithTokens) their tokens;
	// Err when the store could not tell (it counts on local state).
	Member             string
	Ahead, TokensAhead int64
	Err                error
}

// fleetJoining is a request waiting to join the fleet's queue with the
// others of its instance (joinFleet); done is closed once it is answered.
type fleetJoining struct {
	FleetJoin
	w    *waiter
	done chan struct{}
}

// joinFleet joins me to g's fleet queue and returns its answer, its place
// counting this instance's requests before it that are not in the fleet's
// queue yet (they join after it, and go before it in the fleet's order):
// without them, a burst's requests that joined out of their order would
// each count fewer than are before it, and wait for a place they do not
// have instead of being told at once. The requests that come to join while
// a join is in flight join together when it lands (sendJoins), in one
// FleetQueue.JoinAll: a burst's joins cost a round trip to Redis for each
// that was in flight, where one join at a time made the last of a burst of
// 1,000 wait on 1,000 of them (TestAFleetBurstIsToldWithinAFewRoundTrips).
// Each JoinAll answers within the store's timeout.
func (g *Group) joinFleet(me *waiter, withTokens bool, wait time.Duration) *fleetJoining {
	j := &fleetJoining{w: me, done: make(chan struct{}), FleetJoin: FleetJoin{Consumer: me.consumer, Weight: me.weight, Priority: me.priority, MaxPriority: MaxPriority,
		Arrival: me.since, Order: me.arrival, Wait: wait, Tokens: me.tokens, WithTokens: withTokens,
		GiveBack: me.refused}}
	q := &g.queue
	q.joinMu.Lock()
	q.joining = append(q.joining, j)
	lead := !q.joinBusy
	q.joinBusy = true
	q.joinMu.Unlock()
	if lead {
		go g.sendJoins()
	}
	<-j.done
	return j
}

// sendJoins joins the requests waiting to join, all that are waiting in one
// JoinAll, until none is left. Only it joins the fleet's queue, so that
// between a JoinAll and the counts of those not there yet no other join
// lands.
func (g *Group) sendJoins() {
	q := &g.queue
	for {
		q.joinMu.Lock()
		batch := q.joining
		q.joining = nil
		if len(batch) == 0 {
			q.joinBusy = false
			q.joinMu.Unlock()
			return
		}
		q.joinMu.Unlock()
		// Those not in the fleet's queue as the batch is sent: one that
		// leaves it during the round trip (its member lost, its claim
		// refused) is in the fleet's answer, and is not counted again
		// (TestALostFleetPlaceIsJoinedAgain: 1 to 3 of a burst of 20 told
		// 429 at once for a place past the 20 requests there were, in 1 of
		// 60 runs). Only this loop joins: none of them is in it by then.
		outside := q.outsideFleet(batch)
		joins := make([]FleetJoin, len(batch))
		for i, j := range batch {
			joins[i] = j.FleetJoin
		}
		g.Fleet.JoinAll(joins)
		for i, j := range batch {
			j.FleetJoin = joins[i]
			if j.Err == nil {
				j.w.inFleet.Store(true)
			}
		}
		for _, j := range batch {
			if j.Err == nil {
				// Those before it here that are not in the fleet's queue yet.
				out, outTokens := q.count(j.w, outside)
				j.Ahead, j.TokensAhead = j.Ahead+out, j.TokensAhead+outTokens
			}
			close(j.done)
		}
	}
}
