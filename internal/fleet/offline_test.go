package fleet

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// An instance cut off from Redis before it held any declared places starts
// 4 attempts on its own declared rpm of 10; once Redis answers again it
// reports them to the fleet's minute, so another instance then starts 6
// more, not 10 (14 in one minute under rpm 10, before), once the places
// a leased for its demand after the outage went back unused.
func TestDeclaredSpendWithoutPlacesReportedAfterOutage(t *testing.T) {
	url := realRedisURL(t)
	opt, _ := redis.ParseURL(url)
	p := newCutProxy(t, opt.Addr)
	a := newInstance(t, "redis://"+p.l.Addr().String()+"/"+itoa(opt.DB), 50*time.Millisecond, 10, 0)
	b := newInstance(t, url, 50*time.Millisecond, 10, 0)
	eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
	p.setCut(true)
	eventually(t, 5*time.Second, "a's store down", func() bool { return !a.store.Up() })
	for i := range 4 {
		if !a.state.Acquire(time.Now(), 10) {
			t.Fatalf("attempt %d: expected it started on a's own declared rpm", i)
		}
	}
	p.setCut(false)
	eventually(t, 5*time.Second, "a's store up again", a.store.Up)
	// a's lease loop reports; the places its renewal then leased for its
	// demand go back once their use ends (declaredUse), unused.
	time.Sleep(declaredUse + time.Second)
	started := 0
	for range 10 {
		if b.state.Acquire(time.Now(), 10) {
			started++
		}
	}
	if started != 6 {
		t.Errorf("expected b to start the 6 left of rpm 10 after a's 4, started %d", started)
	}
}
