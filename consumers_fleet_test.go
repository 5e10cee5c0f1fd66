package llmrouter

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// In fleet mode a consumer's rpm holds across instances: two routers on
// one Redis (two stores: they differ in poll_interval, so the pool does not
// share one; a timeout a loaded machine does not reach, so that Redis
// decides, not each router's fallback to its own counts), rpm 4, 8 requests alternating between them: 4 reach the
// provider, the others are answered 429 by the router with
// X-LLM-Router-Limit consumer, X-LLM-Router-Consumer-Limit rpm and a
// Retry-After until the fleet's minute has room (about a minute).
func TestConsumerRPMAcrossTwoRouters(t *testing.T) {
	m := miniredis.RunT(t)
	t.Setenv("LLM_ROUTER_TEST_REDIS", "redis://"+m.Addr())
	u := newSeenUpstream(t)
	routers := make([]*Handler, 2)
	for i := range routers {
		routers[i], _ = consumersHandler(t, u, fmt.Sprintf(`"consumer": "{http.request.header.X-Team}", "plans": {"default": {"rpm": 4}},
			"store": {"type": "redis", "url": "{env.LLM_ROUTER_TEST_REDIS}", "timeout": 2000000000, "poll_interval": %d}`, (i+1)*int(time.Second)))
	}
	if routers[0].store == routers[1].store {
		t.Fatal("expected two stores")
	}
	ok := 0
	for i := range 8 {
		w, _, _ := askAs(routers[i%2], "/v1/chat/completions", fastChat, map[string][]string{"X-Team": {"a"}})
		if w.Code == 200 {
			ok++
			continue
		}
		retry, _ := strconv.Atoi(w.Header().Get("Retry-After"))
		if w.Code != 429 || w.Header().Get(HeaderLimit) != "consumer" || w.Header().Get(HeaderConsumerLimit) != "rpm" || retry < 55 || retry > 64 {
			t.Errorf("request %d: expected 429 rpm with a Retry-After of about the minute, got %d %v %s", i, w.Code, w.Header(), w.Body)
		}
	}
	if ok != 4 || u.count() != 4 {
		t.Errorf("expected the rpm's 4 of 8 served across two routers (4 at the provider), got %d (%d at the provider)", ok, u.count())
	}
}
