package fleet

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// cutProxy forwards TCP to a Redis until cut: then it drops every
// connection and every new one, as a Redis unreachable would look.
type cutProxy struct {
	l     net.Listener
	to    string
	cut   atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l, to: to}
	t.Cleanup(func() { l.Close(); p.setCut(true) })
	go p.serve()
	return p
}

func (p *cutProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { _, _ = io.Copy(c, up); c.Close() }()
	}
}

// setCut cuts (true) or restores (false) the way to Redis.
func (p *cutProxy) setCut(cut bool) {
	p.cut.Store(cut)
	if !cut {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// lostReply is a SpendStore whose first AddSpend reaches Redis and is
// applied there, but whose reply is lost (an error instead).
type lostReply struct {
	*Store
	lost atomic.Bool
}

func (s *lostReply) AddSpend(ctx context.Context, key string, usd float64, op capacity.SpendOp, ttl time.Duration) (float64, error) {
	total, err := s.Store.AddSpend(ctx, key, usd, op, ttl)
	if err == nil && s.lost.CompareAndSwap(false, true) {
		return 0, errors.New("i/o timeout (the reply lost)")
	}
	return total, err
}

// Two instances share a budget through a real Redis; Redis is cut off
// for a while, during which each spends 20 answers of $0.001; then it
// is back: within a few seconds Redis' total and both instances' views
// are the bill ($0.050 in all), within one answer's cost. An answer
// whose write reached Redis but whose reply was lost counts once.
func TestFleetSpendReconciledAfterOutage(t *testing.T) {
	url := realRedisURL(t)
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutProxy(t, opt.Addr)
	purl := "redis://" + proxy.l.Addr().String() + "/" + itoa(opt.DB)
	a, b := newInstance(t, purl, 100*time.Millisecond, 0, 0), newInstance(t, purl, 100*time.Millisecond, 0, 0)
	eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
	limit := capacity.SpendLimit{USD: 10, Period: time.Hour}
	lossy := &lostReply{Store: a.store}
	sa := capacity.NewSpending(limit, lossy, "budget:group|rec")
	sb := capacity.NewSpending(limit, b.store, "budget:group|rec")
	const cost = 0.001
	spend := func(n int) {
		for range n {
			sa.Add(time.Now(), cost)
			sb.Add(time.Now(), cost)
		}
	}
	spend(5) // the first of a's is applied in Redis, its reply lost
	proxy.setCut(true)
	eventually(t, 10*time.Second, "the stores down", func() bool { return !a.store.Up() && !b.store.Up() })
	spend(20)
	proxy.setCut(false)
	eventually(t, 10*time.Second, "the stores up again", func() bool { return a.store.Up() && b.store.Up() })

	direct := redis.NewClient(opt)
	defer direct.Close()
	key := a.store.spendKey("budget:group|rec:" + itoa(int(time.Now().UnixNano()/int64(time.Hour))))
	const bill = 50 * cost
	var inRedis, viewA, viewB float64
	deadline := time.Now().Add(5 * time.Second)
	for {
		sa.Over(time.Now())
		sb.Over(time.Now())
		inRedis, _ = direct.Get(context.Background(), key).Float64()
		viewA, viewB = sa.Report(time.Now()).SpentUSD, sb.Report(time.Now()).SpentUSD
		if near(inRedis, bill, cost/2) && near(viewA, bill, cost) && near(viewB, bill, cost) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the outage: Redis has $%.4f, a sees $%.4f, b $%.4f; the bill is $%.4f", inRedis, viewA, viewB, bill)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func near(x, want, within float64) bool { return math.Abs(x-want) <= within }
func itoa(n int) string                 { return strconv.Itoa(n) }

// A write sent again (its reply lost) is added once; another writer's
// write with the same Seq is its own.
func TestAddSpendOncePerOp(t *testing.T) {
	backends(t, func(t *testing.T, url string, _ *miniredis.Miniredis) {
		a := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the store up", func() bool { return a.store.Up() })
		ctx := context.Background()
		for _, w := range []struct {
			op   capacity.SpendOp
			want float64
		}{{capacity.SpendOp{Writer: "a", Seq: 1}, 0.25}, {capacity.SpendOp{Writer: "a", Seq: 1}, 0.25},
			{capacity.SpendOp{Writer: "b", Seq: 1}, 0.5}, {capacity.SpendOp{Writer: "a", Seq: 2}, 0.75}} {
			if total, err := a.store.AddSpend(ctx, "budget:group|g:7", 0.25, w.op, time.Minute); err != nil || total != w.want {
				t.Fatalf("%+v: total %v (%v), want %v", w.op, total, err, w.want)
			}
		}
	})
}
