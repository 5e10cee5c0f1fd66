package main

import (
	"fmt"
	"slices"
)

// summary is one scenario's medians over several rounds of the same run:
// on a shared 2-core machine one run can be hit by a GC pause or another
// process; the median of interleaved rounds is what the targets are read on.
type summary struct {
	Upstream      string    `json:"upstream"`
	LatencyMs     int64     `json:"upstream_latency_ms"`
	Rate          int       `json:"rate"` // 0: closed loop
	Scenario      string    `json:"scenario"`
	Rounds        int       `json:"rounds"`
	Sustained     int       `json:"sustained_rounds"`
	P50           float64   `json:"p50_ms"`
	P99           float64   `json:"p99_ms"`
	Throughput    float64   `json:"throughput_rps"`
	ThroughputMin float64   `json:"throughput_min_rps"`
	ThroughputMax float64   `json:"throughput_max_rps"`
	CPUPerReqUs   float64   `json:"caddy_cpu_per_request_us"`
	CaddyCPUPct   float64   `json:"caddy_cpu_percent"`
	AddedP50      float64   `json:"added_p50_ms"` // median p50 - direct's median p50
	AddedP99      float64   `json:"added_p99_ms"`
	P50s          []float64 `json:"p50s_ms"`
	P99s          []float64 `json:"p99s_ms"`
	Throughputs   []float64 `json:"throughputs_rps"`
}

func med(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// summarize groups rows by scenario (in allScenarios order) and takes the
// medians; added latencies are over direct's medians.
func summarize(rows []loadRow) []summary {
	var out []summary
	for _, sc := range allScenarios {
		s := summary{Scenario: sc.name}
		var cpu, pct []float64
		for _, r := range rows {
			if r.Scenario != sc.name {
				continue
			}
			s.Upstream, s.LatencyMs, s.Rate = r.Upstream, r.LatencyMs, r.Rate
			s.Rounds++
			if r.Sustained {
				s.Sustained++
			}
			s.P50s, s.P99s, s.Throughputs = append(s.P50s, r.P50), append(s.P99s, r.P99), append(s.Throughputs, r.Throughput)
			cpu, pct = append(cpu, r.CaddyCPUPerReqUs), append(pct, r.CaddyCPUPct)
		}
		if s.Rounds == 0 {
			continue
		}
		s.P50, s.P99, s.Throughput = med(s.P50s), med(s.P99s), med(s.Throughputs)
		s.ThroughputMin, s.ThroughputMax = slices.Min(s.Throughputs), slices.Max(s.Throughputs)
		s.CPUPerReqUs, s.CaddyCPUPct = med(cpu), med(pct)
		out = append(out, s)
	}
	for i := range out {
		if out[0].Scenario == direct.name && i > 0 {
			out[i].AddedP50, out[i].AddedP99 = out[i].P50-out[0].P50, out[i].P99-out[0].P99
		}
	}
	return out
}

func findSummary(sums []summary, upstream string, sc string) (summary, bool) {
	for _, s := range sums {
		if s.Upstream == upstream && s.Scenario == sc {
			return s, true
		}
	}
	return summary{}, false
}

// headToHead measures the four scenarios again, interleaved, at the highest
// fixed rate reverse_proxy and router-1 both sustained against the bare 0 ms
// upstream, for -rounds rounds in all (the matrix's run is the first). When
// either is not sustained in most rounds, it tries the next lower rate once.
func (b *bench) headToHead() error {
	var cands []int
	for i := len(b.o.rates) - 1; i >= 0; i-- {
		rate := b.o.rates[i]
		p, ok1 := b.loadRow(b.res.Load, bare0.name, 0, rate, proxy.name)
		r, ok2 := b.loadRow(b.res.Load, bare0.name, 0, rate, router1.name)
		if ok1 && ok2 && p.Sustained && r.Sustained {
			cands = append(cands, rate)
		}
	}
	if len(cands) == 0 {
		b.logf("head to head: no fixed rate sustained by both reverse_proxy and router-1")
		return nil
	}
	for try, rate := range cands[:min(2, len(cands))] {
		var rows []loadRow
		for _, r := range b.res.Load {
			if r.Upstream == bare0.name && r.LatencyMs == 0 && r.Rate == rate {
				rows = append(rows, r)
			}
		}
		for round := 2; round <= b.o.rounds; round++ {
			for _, sc := range allScenarios {
				tag := fmt.Sprintf("rounds-%d-%d-%s", rate, round, sc.name)
				row, err := b.measure(sc, bare0, rate, fixedWorkers(rate, 0), tag)
				if err != nil {
					return err
				}
				row.Round = round
				rows = append(rows, row)
				b.res.Rounds = append(b.res.Rounds, row)
				b.logf("round %d at %5d/s %-13s ok %d/%d  p50 %6.2f ms  p99 %7.2f ms  cpu %5.1f us/req  others %3.0f%%%s",
					round, rate, sc.name, row.OK, row.Requests, row.P50, row.P99, row.CaddyCPUPerReqUs, row.OtherCPUPct,
					map[bool]string{true: "", false: "  NOT SUSTAINED"}[row.Sustained])
			}
		}
		sums := summarize(rows)
		p, _ := findSummary(sums, bare0.name, proxy.name)
		r, _ := findSummary(sums, bare0.name, router1.name)
		if (2*p.Sustained > p.Rounds && 2*r.Sustained > r.Rounds) || try == min(2, len(cands))-1 {
			b.res.HeadToHead, b.res.HeadToHeadRate = sums, rate
			return nil
		}
		b.logf("at %d/s reverse_proxy or router-1 was not sustained in most rounds: comparing at the next lower rate", rate)
	}
	return nil
}
