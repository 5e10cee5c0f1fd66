package fleet

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startCluster starts a Redis Cluster of three primaries (redis-server
// --cluster-enabled, joined by redis-cli --cluster create) on ports
// lo..lo+2 and waits until it serves every slot.
func startCluster(t *testing.T, lo int) []string {
	t.Helper()
	var addrs []string
	for i := range 3 {
		port := lo + i
		r := &redisProc{path: needRedisServer(t), port: port, dir: t.TempDir(),
			args: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}}
		r.start(t)
		t.Cleanup(r.kill)
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", port))
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli is not on PATH (it comes with redis-server: apt-get install redis-server)")
	}
	out, err := exec.Command(cli, append([]string{"--cluster", "create"}, append(addrs, "--cluster-replicas", "0", "--cluster-yes")...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Protocol: 2, DisableIdentity: true})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := c.ClusterInfo(context.Background()).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			// Every primary must agree before scripts land on their slots.
			ok := true
			for _, a := range addrs {
				n := redis.NewClient(&redis.Options{Addr: a, Protocol: 2, DisableIdentity: true})
				s, err := n.ClusterInfo(context.Background()).Result()
				n.Close()
				ok = ok && err == nil && strings.Contains(s, "cluster_state:ok")
			}
			if ok {
				return addrs
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster is not ok after 20 s: %v %s", err, info)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFleetOnARedisCluster runs two router instances as two processes
// sharing a real three-node Redis Cluster (redis+cluster://): a deployment
// whose provider states 10 requests per 4 s window is one budget for the
// fleet. After a warm-up request through each instance, 30 concurrent
// requests split over both within a 2 s deadline: exactly the window's 10
// are served, the provider sends no 429, and the others are answered 429.
// The keys of each deployment share one cluster slot (hash tags), or the
// scripts would fail with CROSSSLOT.
//
// Ports: routers 9500 and 9501, mock 9516, the cluster 9580-9582, admin
// localhost:2599 and localhost:2598.
func TestFleetOnARedisCluster(t *testing.T) {
	needRedisServer(t)
	for _, p := range []int{9500, 9501, 9516, 9580, 9581, 9582, 2599, 2598} {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err != nil {
			t.Fatalf("port %d must be free for this test: %v", p, err)
		} else {
			l.Close()
		}
	}
	addrs := startCluster(t, 9580)
	url := "redis+cluster://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2]
	bin := buildCaddy(t)
	config := func(port, admin int) string {
		return fmt.Sprintf(`{
	admin localhost:%d
	auto_https off
	persist_config off
	grace_period 1ns
}
http://localhost:%d {
	llm_router /v1/* {
		store redis %s {
			timeout 200ms
			poll_interval 200ms
		}
		deadline 2s
		provider limited {
			type openai
			base_url http://localhost:9516/v1
			api_key sk-cluster-limited
		}
		model window {
			deployment limited m-window
		}
	}
}
`, admin, port, url)
	}
	a := startCaddy(t, bin, "a", 2599, config(9500, 2599)+`
http://localhost:9516 {
	llm_mock {
		rate_limit {
			requests 10
			window 4s
		}
	}
}
`)
	b := startCaddy(t, bin, "b", 2598, config(9501, 2598))
	for _, in := range []*caddyProc{a, b} {
		in.waitStoreUp(t)
	}
	for _, in := range []*caddyProc{a, b} {
		if res := in.chat(t, "window"); res.status != 200 {
			t.Fatalf("warm-up through %s: %+v", in.name, res)
		}
	}
	time.Sleep(4*time.Second + 200*time.Millisecond) // the warm-up's window ends
	before := mockStats(t, 9516).RateLimited
	statuses := burst(t, a, b, "window", 30)
	if statuses[200] != 10 || statuses[429] != 20 {
		t.Errorf("expected the window's 10 served and 20 answered 429 across the fleet, got %v", statuses)
	}
	if n := mockStats(t, 9516).RateLimited - before; n != 0 {
		t.Errorf("expected no 429 from the provider, got %d", n)
	}
	for _, in := range []*caddyProc{a, b} {
		if n := in.logLines(t, "CROSSSLOT"); n != 0 {
			t.Errorf("instance %s: %d CROSSSLOT errors", in.name, n)
		}
		if n := in.logLines(t, "fleet store unreachable"); n != 0 {
			t.Errorf("instance %s lost the cluster %d times", in.name, n)
		}
	}
}
