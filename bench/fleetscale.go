package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The fleet-scale benchmark (-only fleet): N router instances (Caddy
// processes, -fleet-instances, default 8) share one redis-server on
// loopback and one llm_mock upstream whose answers state rate-limit
// windows (x-ratelimit-* on every answer, a window never reached), so that
// every attempt spends the fleet's budget; the deployment also declares an
// rpm and a tpm it never reaches (the fleet's declared minute). A vegeta load of a total rate
// (-fleet-rate, default 2,000 req/s) is spread evenly over the instances.
// It prints Redis commands per request, from INFO commandstats before and
// after the measured part (every command Redis ran, those inside scripts
// included; the benchmark's own INFO and MONITOR left out), and the
// hottest key's share of key accesses, from a MONITOR sample of one second
// in the middle of the run (each command's keys: a script's KEYS and every
// command it runs inside).

// Ports of the fleet-scale run, all on 127.0.0.1.
const (
	fleetRouterBase = 18600 // 18600..
	fleetAdminBase  = 18650
	fleetMockPort   = 18698
	fleetMockAdmin  = 18697
	fleetRedisPort  = 18699
)

// fleetRow is one fleet-scale run.
type fleetRow struct {
	Instances  int     `json:"instances"`
	Rate       int     `json:"rate_rps"`
	Requests   int     `json:"requests"`
	OK         int     `json:"ok"`
	Issued     float64 `json:"issued_rps"`
	Throughput float64 `json:"throughput_rps"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	Commands   int64   `json:"redis_commands"`
	PerRequest float64 `json:"redis_commands_per_request"`
	Scripts    int64   `json:"redis_script_calls"`
	// TopCommands: the commands Redis ran most, with their counts.
	TopCommands string  `json:"top_commands"`
	HotKey      string  `json:"hottest_key"`
	HotShare    float64 `json:"hottest_key_share_pct"`
	Keys        int     `json:"keys_sampled"`
	Upstream429 int64   `json:"upstream_429"`
	Note        string  `json:"note,omitempty"`
}

func (b *bench) fleetScale() error {
	row, err := b.fleetRun(b.o.fleetInstances, b.o.fleetRate, b.o.fleetDur)
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	b.res.Fleet = append(b.res.Fleet, row)
	if row.Note != "" {
		b.logf("fleet %s", row.Note)
		return nil
	}
	b.logf("fleet %d instances at %d req/s: issued %.0f req/s, %d of %d OK (p50 %.1f ms, p99 %.1f ms); Redis %d commands (%.3f per request; %d script calls); hottest key %.1f%% of %d accesses (%s); upstream 429s %d; top: %s",
		row.Instances, row.Rate, row.Issued, row.OK, row.Requests, row.P50, row.P99, row.Commands, row.PerRequest,
		row.Scripts, row.HotShare, row.Keys, row.HotKey, row.Upstream429, row.TopCommands)
	return nil
}

// fleetRun starts Redis, the mock and the instances, warms them up (each
// learns the windows and leases its first slices), then measures.
func (b *bench) fleetRun(n, rate int, dur time.Duration) (fleetRow, error) {
	row := fleetRow{Instances: n, Rate: rate}
	redis, err := exec.LookPath("redis-server")
	if err != nil {
		row.Note = "skipped: redis-server is not installed"
		return row, nil
	}
	dir := filepath.Join(b.o.out, "fleet")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return row, err
	}
	redisAddr := fmt.Sprintf("127.0.0.1:%d", fleetRedisPort)
	rc, err := start("redis", []string{redis, "--port", fmt.Sprint(fleetRedisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"},
		nil, "", filepath.Join(b.o.out, "logs", "fleet-redis.log"), redisAddr)
	if err != nil {
		return row, err
	}
	defer rc.stop()
	stop, err := b.fleetProcesses(dir, n)
	defer stop()
	if err != nil {
		return row, err
	}
	var targets []vegeta.Target
	for i := range n {
		targets = append(targets, vegeta.Target{Method: http.MethodPost, URL: fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", fleetRouterBase+i),
			Body: contentionBody(0), Header: http.Header{"Content-Type": {"application/json"}}})
	}
	client := newClient()
	defer client.CloseIdleConnections()
	// Warm-up: the windows learned, the first slices leased, and each
	// instance's demand (its slices' size) settled.
	fleetAttack(client, targets, rate, 3*time.Second)
	before, err := commandStats(redisAddr)
	if err != nil {
		return row, err
	}
	sample := make(chan map[string]int64, 1)
	go func() {
		time.Sleep(dur / 3)
		keys, _ := monitorKeys(redisAddr, time.Second)
		sample <- keys
	}()
	s := fleetAttack(client, targets, rate, dur)
	after, err := commandStats(redisAddr)
	if err != nil {
		return row, err
	}
	row.Requests, row.OK, row.Issued, row.Throughput, row.P50, row.P99 = s.Requests, s.OK, s.Issued, s.Throughput, s.P50, s.P99
	row.Commands, row.Scripts, row.TopCommands = statsDelta(before, after)
	row.PerRequest = float64(row.Commands) / float64(max(row.Requests, 1))
	row.HotKey, row.HotShare, row.Keys = hottest(<-sample)
	var st struct {
		RateLimited int64 `json:"rate_limited"`
	}
	if err := httpJSON(fmt.Sprintf("http://127.0.0.1:%d/llm_mock/stats", fleetMockPort), &st); err == nil {
		row.Upstream429 = st.RateLimited
	}
	return row, nil
}

// fleetProcesses starts the mock and the n instances; stop stops those
// started.
func (b *bench) fleetProcesses(dir string, n int) (stop func(), err error) {
	var started []*child
	stop = func() {
		for _, c := range started {
			c.stop()
		}
	}
	mock := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n\tgrace_period 1ns\n}\n\nhttp://127.0.0.1:%d {\n\tllm_mock {\n\t\trate_limit {\n\t\t\trequests 10000000\n\t\t\ttokens 1000000000\n\t\t\twindow 60s\n\t\t}\n\t}\n}\n",
		fleetMockAdmin, fleetMockPort)
	cfg := filepath.Join(dir, "mock.Caddyfile")
	if err := os.WriteFile(cfg, []byte(mock), 0o644); err != nil {
		return stop, err
	}
	m, err := start("fleet mock", []string{b.o.caddy, "run", "--config", cfg, "--adapter", "caddyfile"}, nil, "",
		filepath.Join(b.o.out, "logs", "fleet-mock.log"), fmt.Sprintf("127.0.0.1:%d", fleetMockPort))
	if err != nil {
		return stop, err
	}
	started = append(started, m)
	for i := range n {
		router := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n\tgrace_period 1ns\n}\n\nhttp://127.0.0.1:%d {\n\tllm_router /v1/* {\n\t\tstore redis redis://127.0.0.1:%d/0\n\t\tprovider p {\n\t\t\ttype openai\n\t\t\tbase_url http://127.0.0.1:%d/v1\n\t\t\tapi_key sk-bench\n\t\t}\n\t\tmodel limited {\n\t\t\tdeployment p gpt-4o-mini {\n\t\t\t\trpm 6000000\n\t\t\t\ttpm 6000000000\n\t\t\t}\n\t\t}\n\t}\n}\n",
			fleetAdminBase+i, fleetRouterBase+i, fleetRedisPort, fleetMockPort)
		cfg := filepath.Join(dir, fmt.Sprintf("router%d.Caddyfile", i))
		if err := os.WriteFile(cfg, []byte(router), 0o644); err != nil {
			return stop, err
		}
		r, err := start("fleet router", []string{b.o.caddy, "run", "--config", cfg, "--adapter", "caddyfile"}, nil, b.o.caddyCPUs,
			filepath.Join(b.o.out, "logs", fmt.Sprintf("fleet-router%d.log", i)), fmt.Sprintf("127.0.0.1:%d", fleetRouterBase+i))
		if err != nil {
			return stop, err
		}
		started = append(started, r)
	}
	return stop, nil
}

// fleetAttack sends rate requests per second in all, round robin over the
// targets, for dur.
func fleetAttack(client *http.Client, targets []vegeta.Target, rate int, dur time.Duration) loadStats {
	a := vegeta.NewAttacker(vegeta.Client(client), vegeta.MaxBody(0), vegeta.Timeout(30*time.Second), vegeta.Workers(64))
	lat := make([]time.Duration, 0, rate*int(dur/time.Second+1))
	s := loadStats{Errors: map[string]int{}}
	var first, last time.Time
	for r := range a.Attack(vegeta.NewStaticTargeter(targets...), vegeta.ConstantPacer{Freq: rate, Per: time.Second}, dur, "") {
		s.Requests++
		if first.IsZero() || r.Timestamp.Before(first) {
			first = r.Timestamp
		}
		if r.Timestamp.After(last) {
			last = r.Timestamp
		}
		if r.Code == http.StatusOK && r.Error == "" {
			s.OK++
			lat = append(lat, r.Latency)
		}
	}
	if s.Requests > 1 {
		s.Issued = float64(s.Requests-1) / last.Sub(first).Seconds()
		s.Throughput = float64(s.OK) / dur.Seconds()
	}
	s.P50, s.P99 = pct(lat, 0.50), pct(lat, 0.99)
	return s
}

// redisCommand sends one command on c (RESP) and returns its reply's
// first line and, for a bulk string, its body.
func redisCommand(c net.Conn, r *bufio.Reader, args ...string) (string, error) {
	var s strings.Builder
	fmt.Fprintf(&s, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&s, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(s.String())); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "$") {
		return line, err
	}
	n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
	buf := make([]byte, n+2)
	_, err = io.ReadFull(r, buf)
	return string(buf[:n]), err
}

var cmdstat = regexp.MustCompile(`(?m)^cmdstat_([a-z|_-]+):calls=(\d+)`)

// commandStats returns INFO commandstats: calls per command.
func commandStats(addr string) (map[string]int64, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	body, err := redisCommand(c, bufio.NewReader(c), "INFO", "commandstats")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, m := range cmdstat.FindAllStringSubmatch(body, -1) {
		out[m[1]], _ = strconv.ParseInt(m[2], 10, 64)
	}
	return out, nil
}

// statsDelta sums the calls between two INFO commandstats, the
// benchmark's own (info, monitor, ping) left out.
func statsDelta(before, after map[string]int64) (total, scripts int64, top string) {
	type kv struct {
		k string
		n int64
	}
	var all []kv
	for k, n := range after {
		d := n - before[k]
		if d <= 0 || k == "info" || k == "monitor" || k == "ping" {
			continue
		}
		total += d
		if k == "evalsha" || k == "eval" {
			scripts += d
		}
		all = append(all, kv{k, d})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n })
	var parts []string
	for _, e := range all[:min(len(all), 6)] {
		parts = append(parts, fmt.Sprintf("%s %d", e.k, e.n))
	}
	return total, scripts, strings.Join(parts, ", ")
}

var quoted = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)

// keyless are the commands that name no key (their first argument is
// something else).
var keyless = map[string]bool{"TIME": true, "PING": true, "PUBLISH": true, "SUBSCRIBE": true, "INFO": true,
	"CLIENT": true, "HELLO": true, "SELECT": true, "SCRIPT": true, "COMMAND": true}

// monitorKeys counts each key's accesses over d with MONITOR.
func monitorKeys(addr string, d time.Duration) (map[string]int64, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d))
	r := bufio.NewReaderSize(c, 1<<16)
	if _, err := redisCommand(c, r, "MONITOR"); err != nil {
		return nil, err
	}
	keys := map[string]int64{}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return keys, nil // the deadline ends the sample
		}
		args := quoted.FindAllStringSubmatch(line, -1)
		if len(args) < 2 {
			continue
		}
		name := strings.ToUpper(args[0][1])
		switch {
		case keyless[name]:
		case name == "EVALSHA" || name == "EVAL":
			nk, _ := strconv.Atoi(args[2][1])
			for i := 3; i < 3+nk && i < len(args); i++ {
				keys[args[i][1]]++
			}
		default:
			keys[args[1][1]]++
		}
	}
}

// hottest returns the key accessed most, its share of all accesses (%),
// and how many accesses the sample saw.
func hottest(keys map[string]int64) (string, float64, int) {
	var total, top int64
	hot := ""
	for k, n := range keys {
		total += n
		if n > top {
			hot, top = k, n
		}
	}
	if total == 0 {
		return "", 0, 0
	}
	return hot, 100 * float64(top) / float64(total), int(total)
}

// fleetTable renders the rows for the report.
func fleetTable(rows []fleetRow) string {
	var out [][]string
	for _, r := range rows {
		if r.Note != "" {
			out = append(out, []string{fmt.Sprint(r.Instances), r.Note, "", "", "", "", ""})
			continue
		}
		out = append(out, []string{fmt.Sprint(r.Instances), fmt.Sprintf("%d (issued %.0f)", r.Rate, r.Issued),
			fmt.Sprintf("%d / %d", r.OK, r.Requests), f1(r.P50) + " / " + f1(r.P99),
			fmt.Sprintf("%d (%s)", r.Commands, f3(r.PerRequest)), fmt.Sprintf("%.1f%% (%s)", r.HotShare, r.HotKey), fmt.Sprint(r.Upstream429)})
	}
	return table([]string{"instances", "rate req/s", "OK / sent", "p50 / p99 ms", "Redis commands (per request)", "hottest key", "upstream 429s"}, out)
}

// fleetTargets judges the run (issue 30): <= 0.1 Redis commands per
// request, no key above its share, no upstream 429.
func (b *bench) fleetTargets() []target {
	var ts []target
	for _, r := range b.res.Fleet {
		t := target{Name: fmt.Sprintf("fleet: %d instances", r.Instances), Goal: "Redis commands per request <= 0.1; no upstream 429"}
		if r.Note != "" {
			t.Figure, t.Status = r.Note, "NOT MEASURED"
			ts = append(ts, t)
			continue
		}
		t.Figure = fmt.Sprintf("%.3f commands per request at %.0f req/s; hottest key %.1f%%; %d upstream 429s", r.PerRequest, r.Issued, r.HotShare, r.Upstream429)
		t.Status = "MET"
		if r.PerRequest > 0.1 || r.Upstream429 > 0 {
			t.Status = "NOT MET"
		}
		ts = append(ts, t)
	}
	return ts
}
