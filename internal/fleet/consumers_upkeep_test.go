package fleet

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// A consumer whose fleet-wide minute is full costs no Redis call while
// nothing asks: two instances admit the 5 of rpm 5 (their demand stays
// up for a couple of seconds), then no request comes for 1.5 s. The
// background's renewals find the minute full once and wait for it to
// have room; they do not ask for places the minute cannot grant every
// leaseTick (a grant of 0 requests, written to the minute each time).
func TestAFullConsumerMinuteCostsNoRenewals(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		regs := make([]*consumer.Registry, 2)
		hooks := []*countHook{{}, {}}
		for i := range regs {
			s, err := New(Options{URL: url, KeyPrefix: keyPrefix(t), PollInterval: time.Hour, Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			eventually(t, 5*time.Second, "the store up", s.Up)
			r, err := consumer.New([]consumer.Plan{{Name: consumer.DefaultPlan, RPM: 5}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			r.SetFleet(s)
			regs[i] = r
			s.client.AddHook(hooks[i])
		}
		for i := range 5 {
			tk, ref := regs[i%2].Admit(time.Now(), "alice", "fast", 10)
			if ref != nil {
				t.Fatalf("request %d of rpm 5 refused: %s", i, ref.Message)
			}
			tk.Done(time.Now(), 0)
		}
		before := hooks[0].n.Load() + hooks[1].n.Load()
		time.Sleep(1500 * time.Millisecond)
		cmds := hooks[0].n.Load() + hooks[1].n.Load() - before
		t.Logf("%d Redis commands in 1.5 s with the minute full and no request", cmds)
		if cmds > 4 {
			t.Errorf("expected at most a renewal per instance finding the minute full (4 commands), got %d", cmds)
		}
		if _, ref := regs[0].Admit(time.Now(), "alice", "fast", 10); ref == nil || ref.Limit != consumer.LimitRPM {
			t.Errorf("expected the sixth request refused for rpm, got %+v", ref)
		}
	})
}
