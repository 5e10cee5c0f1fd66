// Command llmbench measures what llm_router costs its users, side by side
// with the baselines on the same machine: requests sent directly to a fast
// upstream, through Caddy's reverse_proxy, through llm_router with one
// deployment, and with eight deployments whose answers carry rate-limit
// headers. See bench/README.md; `make bench` runs it.
//
//	llmbench run -caddy <dev caddy binary> [-out bench/results] [flags]
//	llmbench upstream -base <port> [-latency 50ms]
//
// Everything listens on 127.0.0.1; every load run is bounded in time.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  llmbench run -caddy <dev caddy binary> [-out dir] [flags]   the whole benchmark (make bench)
  llmbench upstream -base <port> [-latency d]                  the bare upstream alone`)
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	switch os.Args[1] {
	case "upstream":
		runUpstream(os.Args[2:])
	case "run":
		os.Exit(runBench(os.Args[2:]))
	default:
		usage()
		os.Exit(2)
	}
}

// Ports, all on 127.0.0.1.
const (
	caddyPort    = 18080 // the Caddy under test
	caddyAdmin   = 18019 // its admin endpoint (pprof)
	bare0Base    = 18100 // bare upstream, 0 ms: 18100..18110
	bare50Base   = 18200 // bare upstream, 50 ms
	mock0Base    = 18300 // llm_mock, 0 ms: 18300..18308, admin 18390
	mock50Base   = 18400 // llm_mock, 50 ms: 18400..18408, admin 18490
	mockAdminOff = 90
)

type options struct {
	caddy, out, configs, repo string
	dur, warm                 time.Duration
	rates                     []int
	closedWorkers             int
	rounds                    int
	profileRate               int
	cpuRate                   int
	headlineStart             int
	headlineStep              int
	profileDur                time.Duration
	streamN                   int
	openStreams               int
	mock, gobench, profile    bool
	benchtime                 string
	only                      map[string]bool
	noise                     float64
	retries                   int
	busyBudget                time.Duration
	driverCPUs, caddyCPUs     string
	allCPUs                   string
	// contentionLatencies are the answer latencies each contention
	// scenario runs at, contentionRuns how many times, contentionOnly
	// the scenarios (nil: all).
	contentionLatencies []time.Duration
	contentionRuns      int
	contentionOnly      map[string]bool
	// fleetInstances, fleetRate, fleetDur: the fleet-scale run (fleetscale.go).
	fleetInstances, fleetRate int
	fleetDur                  time.Duration
	// cpuRounds, cpuStreams, cpuStreamRate: the cpu mode's rounds of each
	// scenario, streams per streaming round and streams opened per second.
	cpuRounds, cpuStreams int
	cpuStreamRate         float64
	cpuProfile            bool
}

func runBench(args []string) int {
	var o options
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	fs.StringVar(&o.caddy, "caddy", "", "the development Caddy binary (go build ./cmd/caddy); required")
	fs.StringVar(&o.out, "out", "bench/results", "directory for logs, profiles, results.json and report.md")
	fs.StringVar(&o.configs, "configs", "bench/configs", "directory of the Caddyfiles")
	fs.DurationVar(&o.dur, "duration", 3*time.Second, "measured part of each fixed-rate and closed-loop run")
	fs.DurationVar(&o.warm, "warmup", 500*time.Millisecond, "warm-up before each measured run (same rate)")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds of the head-to-head comparison (bare 0 ms upstream, at the highest rate both sustain) and of the closed loop; the targets are read on their medians")
	rates := fs.String("rates", "500,2000,5000", "fixed rates, requests per second")
	fs.IntVar(&o.closedWorkers, "workers", 64, "concurrent requests of the closed-loop (maximum throughput) runs")
	fs.IntVar(&o.streamN, "streams", 60, "streams per streaming run (200 chunks 2 ms apart, 20 streams/s)")
	fs.IntVar(&o.openStreams, "open-streams", 2000, "concurrent open streams of the memory run")
	fs.BoolVar(&o.mock, "mock", true, "also measure against llm_mock upstreams")
	fs.BoolVar(&o.gobench, "gobench", true, "run the Go benchmarks of ./internal/router, ./internal/adapters, ./internal/jsonbody and ./internal/api")
	fs.StringVar(&o.benchtime, "benchtime", "500ms", "go test -benchtime")
	fs.BoolVar(&o.profile, "profile", true, "take CPU and allocation profiles of the router at the highest sustained rate")
	fs.Float64Var(&o.noise, "noise", 25, "measure a run again when other processes used more than this % of a CPU meanwhile")
	fs.IntVar(&o.retries, "retries", 2, "how many times a noisy run is measured again")
	fs.DurationVar(&o.busyBudget, "busy-budget", 90*time.Second, "longest total time spent waiting for other processes to calm down or measuring noisy runs again")
	only := fs.String("only", "", "run only these parts, comma-separated: gobench, load, closed, stream, cpu, headline, memory, failover, contention, affinity, fleet, profile")
	fs.IntVar(&o.cpuRate, "cpu-rate", 1000, "rate of the cpu mode's non-streaming rounds, requests per second (0: a closed loop of -workers concurrent requests, Caddy saturated)")
	fs.IntVar(&o.cpuRounds, "cpu-rounds", 5, "alternating rounds of each scenario in the cpu mode, non-streaming and streaming alike; the ratios are the medians of each round's ratio to reverse_proxy's")
	fs.IntVar(&o.cpuStreams, "cpu-streams", 240, "streams per streaming round of the cpu mode (200 chunks 2 ms apart each)")
	fs.Float64Var(&o.cpuStreamRate, "cpu-stream-rate", 80, "streams opened per second in the cpu mode's streaming rounds (80: about 32 open at once)")
	fs.BoolVar(&o.cpuProfile, "cpu-profile", false, "after the cpu mode's rounds, one more streaming round of each scenario with a CPU profile of the Caddy (profiles/cpu-streaming-<scenario>.pprof)")
	fs.IntVar(&o.headlineStart, "headline-start", 1000, "first rate of the headline's ramp, requests per second")
	fs.IntVar(&o.headlineStep, "headline-step", 500, "step of the headline's ramp, requests per second")
	fs.IntVar(&o.profileRate, "profile-rate", 0, "rate of the profiled runs (0: the head-to-head rate, else the highest rate reverse_proxy and router-1 sustained)")
	fs.DurationVar(&o.profileDur, "profile-duration", 5*time.Second, "length of each CPU and allocation profile")
	latencies := fs.String("contention-latencies", "100ms", "answer latencies of the contention scenarios, comma-separated; above 100ms a scenario's windows, deadline and spread are stretched to three answers a window at least")
	fs.IntVar(&o.contentionRuns, "contention-runs", 1, "how many times the contention scenarios run")
	scenarios := fs.String("contention-scenarios", "", "only these contention scenarios, comma-separated (burst, unequal, open-loop, tpm, fleet, fleet-burst, burst-floor)")
	fs.IntVar(&o.fleetInstances, "fleet-instances", 8, "router instances of the fleet-scale run, sharing one Redis")
	fs.IntVar(&o.fleetRate, "fleet-rate", 2000, "total rate of the fleet-scale run, requests per second over all instances")
	fs.DurationVar(&o.fleetDur, "fleet-duration", 5*time.Second, "measured part of the fleet-scale run")
	pin := fs.Bool("pin", true, "pin the Caddy under test to its own CPUs, apart from the load generator and upstreams (taskset)")
	_ = fs.Parse(args)
	if o.caddy == "" {
		fmt.Fprintln(os.Stderr, "llmbench run: -caddy is required")
		return 2
	}
	if *only != "" {
		o.only = names(*only)
	}
	for _, l := range strings.Split(*latencies, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(l))
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "llmbench run: bad contention latency %q\n", l)
			return 2
		}
		o.contentionLatencies = append(o.contentionLatencies, d)
	}
	if *scenarios != "" {
		o.contentionOnly = names(*scenarios)
	}
	for _, r := range strings.Split(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "llmbench run: bad rate %q\n", r)
			return 2
		}
		o.rates = append(o.rates, n)
	}

	// Pinning: re-run this process on the driver's CPUs; the Caddy under
	// test is started on the others.
	if p := os.Getenv("LLMBENCH_PINNED"); p != "" {
		parts := strings.Split(p, "/")
		o.driverCPUs, o.caddyCPUs, o.allCPUs = parts[0], parts[1], parts[2]
	} else if *pin {
		if d, c := pinning(); d != "" {
			self, err := os.Executable()
			taskset, err2 := exec.LookPath("taskset")
			if err == nil && err2 == nil {
				env := append(os.Environ(), "LLMBENCH_PINNED="+d+"/"+c+"/"+cpuRange(0, runtime.NumCPU()-1))
				err = syscall.Exec(taskset, append([]string{"taskset", "-c", d, self}, os.Args[1:]...), env)
			}
			fmt.Fprintf(os.Stderr, "llmbench: cannot pin (%v %v); running unpinned\n", err, err2)
		}
	}

	o.caddy, o.out, o.configs = absPath(o.caddy), absPath(o.out), absPath(o.configs)
	o.repo, _ = os.Getwd()
	for _, d := range []string{"logs", "profiles"} {
		if err := os.MkdirAll(filepath.Join(o.out, d), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "\nllmbench: interrupted; stopping the processes it started")
		stopChildren()
		os.Exit(130)
	}()
	defer stopChildren()

	b := &bench{o: o, started: time.Now(), budget: o.busyBudget}
	if err := b.run(); err != nil {
		fmt.Fprintln(os.Stderr, "llmbench:", err)
		return 1
	}
	return 0
}

// results is everything measured, written to results.json.
type results struct {
	Machine machine        `json:"machine"`
	Options map[string]any `json:"options"`
	Load    []loadRow      `json:"load"`
	Closed  []loadRow      `json:"closed_loop"`
	// ClosedSummary: medians of the closed-loop rounds.
	ClosedSummary []summary `json:"closed_loop_medians"`
	// Rounds are the head-to-head runs after the matrix; HeadToHead their
	// medians (with the matrix's run) at HeadToHeadRate.
	Rounds         []loadRow        `json:"head_to_head_runs"`
	HeadToHead     []summary        `json:"head_to_head"`
	HeadToHeadRate int              `json:"head_to_head_rate"`
	Streaming      []streamRow      `json:"streaming"`
	CPU            []cpuRow         `json:"cpu_same_process"`
	CPUSummary     []cpuSummary     `json:"cpu_same_process_medians"`
	Headline       []headlineRow    `json:"headline_runs"`
	HeadlineMax    []headlineResult `json:"headline"`
	Memory         []memoryRow      `json:"open_streams"`
	Failover       []failoverRow    `json:"failover"`
	Contention     []contentionRow  `json:"contention"`
	Affinity       []affinityRow    `json:"affinity"`
	Fleet          []fleetRow       `json:"fleet"`
	GoBench        []goBench        `json:"go_benchmarks"`
	Profiles       []profileInfo    `json:"profiles"`
	Targets        []target         `json:"targets"`
	Elapsed        string           `json:"elapsed"`
}

func (b *bench) run() error {
	o := b.o
	b.res.Machine = describeMachine(o)
	b.res.Options = map[string]any{
		"duration": o.dur.String(), "warmup": o.warm.String(), "rates": o.rates, "rounds": o.rounds,
		"noise_percent": o.noise, "retries": o.retries, "busy_budget": o.busyBudget.String(),
		"closed_loop_workers": o.closedWorkers, "streams": o.streamN,
		"cpu_rounds": o.cpuRounds, "cpu_streams": o.cpuStreams, "cpu_stream_rate": o.cpuStreamRate, "open_streams": o.openStreams,
		"driver_cpus": o.driverCPUs, "caddy_cpus": o.caddyCPUs,
	}
	b.logf("machine: %s, %d CPUs, %s; Go %s; pinning: driver+upstreams on CPU %s, Caddy under test on CPU %s",
		b.res.Machine.CPU, b.res.Machine.CPUs, b.res.Machine.Memory, b.res.Machine.Go, orNone(o.driverCPUs), orNone(o.caddyCPUs))

	steps := []struct {
		name string
		on   bool
		run  func() error
	}{
		{"gobench", o.gobench, b.goBenchmarks},
		{"", true, b.startUpstreams},
		{"load", true, b.loadMatrix},
		{"load", true, b.headToHead},
		{"closed", true, b.closedLoop},
		{"stream", true, b.streaming},
		{"cpu", true, b.cpuRun},
		{"headline", true, b.headline},
		{"memory", true, b.openStreamsRun},
		{"failover", true, b.failover},
		{"contention", true, b.contention},
		{"affinity", true, b.affinity},
		{"fleet", true, b.fleetScale},
		{"profile", o.profile, b.profiles},
	}
	for _, s := range steps {
		if !s.on || (s.name != "" && o.only != nil && !o.only[s.name]) {
			continue
		}
		if err := s.run(); err != nil {
			return err
		}
	}
	b.res.Elapsed = time.Since(b.started).Round(time.Second).String()
	b.res.Targets = b.targets()
	report := b.report()
	fmt.Print("\n" + report)
	if err := os.WriteFile(filepath.Join(o.out, "report.md"), []byte(report), 0o644); err != nil {
		return err
	}
	raw, _ := json.MarshalIndent(b.res, "", "  ")
	if err := os.WriteFile(filepath.Join(o.out, "results.json"), raw, 0o644); err != nil {
		return err
	}
	b.logf("done in %s: %s, %s", b.res.Elapsed, filepath.Join(o.out, "report.md"), filepath.Join(o.out, "results.json"))
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// logf prints progress to stderr, with the time since the start.
func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(b.started).Seconds(), fmt.Sprintf(format, args...))
}

// names is the set of a comma-separated list's names.
func names(list string) map[string]bool {
	set := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		set[strings.TrimSpace(n)] = true
	}
	return set
}
