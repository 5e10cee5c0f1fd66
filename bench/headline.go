package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The headline (-only headline): the highest rate, requests per second,
// at which reverse_proxy and router-1 each keep p99 added latency under
// headlineP99 on the machine: one Caddy (configs/same_process.Caddyfile)
// on every CPU but the load generator's, the bare 0 ms upstream and the
// load generator pinned together to theirs. The rate climbs by
// -headline-step from -headline-start; at each rate direct, reverse_proxy
// and router-1 run in turn (their order rotating), for -duration after a
// warm-up of -warmup; added latency is a scenario's p99 less direct's at
// the same rate. A scenario's ramp ends at its first rate that fails
// (not sustained, or over the bound); its headline is the last rate
// before it. A ramp also ends where direct's own p99 reaches the bound (or
// direct fails a request): there the machine, not Caddy, is the limit,
// and the ramp's rates are lower bounds. -rounds ramps; the headline is
// their median.

// headlineP99 bounds the added p99 latency of a rate that counts.
const headlineP99 = 5.0 // ms

// headlineRow is one run of the headline's ramp.
type headlineRow struct {
	Ramp      int     `json:"ramp"`
	Rate      int     `json:"rate"`
	Scenario  string  `json:"scenario"`
	OK        int     `json:"ok"`
	Requests  int     `json:"requests"`
	Issued    float64 `json:"issued_rps"`
	P50       float64 `json:"p50_ms"`
	P99       float64 `json:"p99_ms"`
	AddedP99  float64 `json:"added_p99_ms"`
	CPUPct    float64 `json:"caddy_cpu_percent"`
	Met       bool    `json:"met"`
	OtherLoad float64 `json:"other_cpu_percent"`
}

// headlineResult is each scenario's headline, per ramp and their median.
type headlineResult struct {
	Scenario string `json:"scenario"`
	Rates    []int  `json:"max_rates"`
	Median   int    `json:"median_max_rate"`
	// MachineLimited: in that ramp direct's own p99 went over the bound
	// first (the machine, not Caddy, ended it): its rate is a lower bound.
	MachineLimited []bool `json:"machine_limited"`
}

var headlineScenarios = []struct {
	sc   scenario
	port int
}{{direct, 0}, {proxy, cpuPortProxy}, {router1, cpuPortRouter1}}

func (b *bench) headline() error {
	c, err := b.startSameProcess("headline-same-process")
	if err != nil {
		return err
	}
	defer c.stop()
	best := map[string][]int{}
	limited := make([]bool, b.o.rounds)
	for ramp := 1; ramp <= b.o.rounds; ramp++ {
		last := map[string]int{}
		done := map[string]bool{}
		for step, rate := 0, b.o.headlineStart; !done[proxy.name] || !done[router1.name]; step, rate = step+1, rate+b.o.headlineStep {
			var base headlineRow
			for k := range headlineScenarios {
				s := headlineScenarios[(k+step)%len(headlineScenarios)]
				if s.sc != direct && done[s.sc.name] {
					continue
				}
				row := b.headlineOnce(c, s.sc, s.port, rate)
				row.Ramp = ramp
				if s.sc == direct {
					base = row
				}
				b.res.Headline = append(b.res.Headline, row)
			}
			if base.P99 >= headlineP99 || base.OK < base.Requests {
				// The upstream itself, unproxied, is over the bound: the
				// machine (the load generator, the upstream, other
				// processes), not Caddy, ends this ramp.
				b.logf("headline ramp %d at %d/s: direct's own p99 is %.2f ms (%d/%d ok): the machine limits this ramp; its figures are lower bounds",
					ramp, rate, base.P99, base.OK, base.Requests)
				limited[ramp-1] = true
				break
			}
			for i := range b.res.Headline {
				r := &b.res.Headline[i]
				if r.Ramp != ramp || r.Rate != rate || r.Scenario == direct.name {
					continue
				}
				r.AddedP99 = r.P99 - base.P99
				r.Met = r.Requests > 0 && float64(r.OK) >= 0.999*float64(r.Requests) && r.Issued >= 0.97*float64(rate) && r.AddedP99 < headlineP99
				b.logf("headline ramp %d at %5d/s %-13s ok %d/%d  p99 %6.2f ms (direct %6.2f: +%5.2f)  Caddy CPU %3.0f%%  others %3.0f%%  %s",
					ramp, rate, r.Scenario, r.OK, r.Requests, r.P99, base.P99, r.AddedP99, r.CPUPct, r.OtherLoad, map[bool]string{true: "met", false: "NOT MET"}[r.Met])
				if r.Met {
					last[r.Scenario] = rate
				} else {
					done[r.Scenario] = true
				}
			}
			if step >= 40 {
				break
			}
		}
		for _, sc := range []string{proxy.name, router1.name} {
			best[sc] = append(best[sc], last[sc])
		}
	}
	for _, sc := range []string{proxy.name, router1.name} {
		sorted := slices.Clone(best[sc])
		slices.Sort(sorted)
		b.res.HeadlineMax = append(b.res.HeadlineMax, headlineResult{Scenario: sc, Rates: best[sc], Median: sorted[len(sorted)/2], MachineLimited: limited})
	}
	return nil
}

// headlineOnce runs one rate of the ramp against sc (its site on port; the
// upstream itself for direct).
func (b *bench) headlineOnce(c *child, sc scenario, port, rate int) headlineRow {
	url := chatURL(direct, bare0)
	if sc != direct {
		url = fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	}
	client := newClient()
	defer client.CloseIdleConnections()
	b.waitQuiet()
	attack(client, url, chatBody, rate, fixedWorkers(rate, 0), b.o.warm)
	cpu0, _ := cpuTime(c.pid())
	t0, s0 := time.Now(), snapshot()
	st := attack(client, url, chatBody, rate, fixedWorkers(rate, 0), b.o.dur)
	wall := time.Since(t0)
	cpu1, _ := cpuTime(c.pid())
	row := headlineRow{Rate: rate, Scenario: sc.name, OK: st.OK, Requests: st.Requests, Issued: st.Issued,
		P50: st.P50, P99: st.P99, OtherLoad: otherLoad(s0, snapshot())}
	if sc != direct {
		row.CPUPct = 100 * float64(cpu1-cpu0) / float64(wall)
	}
	return row
}

// headlineTable is the report's table of the headline.
func (b *bench) headlineTable() string {
	var rows [][]string
	for _, h := range b.res.HeadlineMax {
		rates := make([]string, len(h.Rates))
		for i, r := range h.Rates {
			rates[i] = strconv.Itoa(r)
			if i < len(h.MachineLimited) && h.MachineLimited[i] {
				rates[i] += " (machine-limited)"
			}
		}
		rows = append(rows, []string{h.Scenario, strconv.Itoa(h.Median), strings.Join(rates, ", ")})
	}
	return table([]string{"scenario", "max req/s at p99 added < 5 ms (median)", "each ramp"}, rows)
}
