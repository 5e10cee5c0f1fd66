package fleet

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tests run against miniredis (fast, in process, its clock settable) and,
// where it matters that Redis itself runs the scripts, against a real
// redis-server: the one LLM_ROUTER_REDIS_URL names (.ci/run starts one), or
// one the test starts when redis-server is on PATH. Without either, the
// real-Redis tests skip, except under CI (CI set), where they fail.

// needRedisServer returns the path of redis-server, or skips the test (fails
// it under CI).
func needRedisServer(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is not on PATH: CI must install it (.ci/run does: apt-get install -y redis-server)")
		}
		t.Skip("redis-server is not on PATH (apt-get install redis-server); skipped outside CI")
	}
	return path
}

// realRedisURL returns the URL of a real Redis for the test: the one
// LLM_ROUTER_REDIS_URL names, else a redis-server started for it.
func realRedisURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("LLM_ROUTER_REDIS_URL"); u != "" {
		return u
	}
	return startRedis(t, freePort(t, 0, 0)).URL()
}

// redisProc is a redis-server the test started; only it is ever signalled.
type redisProc struct {
	path string
	port int
	dir  string
	args []string // more redis-server arguments
	cmd  *exec.Cmd
	done chan struct{}
}

func (r *redisProc) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

// startRedis starts redis-server on port (no persistence), waits until it
// answers, and kills it when the test ends.
func startRedis(t testing.TB, port int) *redisProc {
	t.Helper()
	r := &redisProc{path: needRedisServer(t), port: port, dir: t.TempDir()}
	r.start(t)
	t.Cleanup(r.kill)
	return r
}

func (r *redisProc) start(t testing.TB) {
	t.Helper()
	args := append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir}, r.args...)
	cmd := exec.Command(r.path, args...)
	logf, err := os.Create(filepath.Join(r.dir, fmt.Sprintf("redis-%d.log", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	r.cmd, r.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(r.done)
	}()
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port), Protocol: 2, DisableIdentity: true})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		select {
		case <-r.done:
			t.Fatalf("redis-server on port %d exited at start; see %s", r.port, logf.Name())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on port %d does not answer", r.port)
		}
	}
}

// kill ends the redis-server at once (SIGKILL, by its own pid), as a crash would.
func (r *redisProc) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}

// freePort returns a free TCP port on 127.0.0.1: within [lo, hi] when given,
// else any.
var portMu sync.Mutex

func freePort(t testing.TB, lo, hi int) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	if lo == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	for p := lo; p <= hi; p++ {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatalf("no free port in %d-%d", lo, hi)
	return 0
}
