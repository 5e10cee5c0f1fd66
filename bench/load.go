package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// newClient is the load generator's HTTP/1.1 client: keep-alive, as many
// idle connections as there are requests in flight, no compression.
func newClient() *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        20000,
			MaxIdleConnsPerHost: 20000,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		},
	}
}

// loadStats summarizes one non-streaming attack.
type loadStats struct {
	Requests   int            `json:"requests"`
	OK         int            `json:"ok"`
	Errors     map[string]int `json:"errors,omitempty"`
	Issued     float64        `json:"issued_rps"`     // requests sent per second
	Throughput float64        `json:"throughput_rps"` // successful answers per second
	P50        float64        `json:"p50_ms"`
	P90        float64        `json:"p90_ms"`
	P99        float64        `json:"p99_ms"`
	Max        float64        `json:"max_ms"`
}

// attack sends POST body to url for dur, at rate requests per second
// (vegeta's constant pacer, workers added as needed), or with rate 0 as
// fast as workers concurrent requests allow (closed loop).
func attack(client *http.Client, url string, body []byte, rate, workers int, dur time.Duration) loadStats {
	target := vegeta.NewStaticTargeter(vegeta.Target{
		Method: http.MethodPost, URL: url, Body: body,
		Header: http.Header{"Content-Type": {"application/json"}},
	})
	opts := []func(*vegeta.Attacker){vegeta.Client(client), vegeta.MaxBody(0), vegeta.Timeout(30 * time.Second)}
	pacer := vegeta.ConstantPacer{Freq: rate, Per: time.Second}
	if rate > 0 {
		opts = append(opts, vegeta.Workers(uint64(max(workers, 1))))
	} else {
		opts = append(opts, vegeta.Workers(uint64(workers)), vegeta.MaxWorkers(uint64(workers)))
	}
	a := vegeta.NewAttacker(opts...)
	lat := make([]time.Duration, 0, max(rate, 1000)*int(dur/time.Second+1))
	s := loadStats{Errors: map[string]int{}}
	var first, lastStart, end time.Time
	for r := range a.Attack(target, pacer, dur, "") {
		s.Requests++
		if first.IsZero() || r.Timestamp.Before(first) {
			first = r.Timestamp
		}
		if r.Timestamp.After(lastStart) {
			lastStart = r.Timestamp
		}
		if e := r.Timestamp.Add(r.Latency); e.After(end) {
			end = e
		}
		if r.Code == http.StatusOK && r.Error == "" {
			s.OK++
			lat = append(lat, r.Latency)
			continue
		}
		msg := r.Error
		if msg == "" {
			msg = fmt.Sprintf("status %d", r.Code)
		}
		s.Errors[shortError(msg)]++
	}
	if s.Requests > 1 {
		s.Issued = float64(s.Requests-1) / lastStart.Sub(first).Seconds()
		s.Throughput = float64(s.OK) / end.Sub(first).Seconds()
	}
	s.P50, s.P90, s.P99, s.Max = pct(lat, 0.50), pct(lat, 0.90), pct(lat, 0.99), pct(lat, 1)
	return s
}

// shortError keeps error counts readable: the end of the message says what
// happened ("connection refused", "EOF").
func shortError(msg string) string {
	if i := strings.LastIndex(msg, ": "); i >= 0 && len(msg)-i < 60 {
		return msg[i+2:]
	}
	if len(msg) > 80 {
		return msg[:80]
	}
	return msg
}

// pct returns the q-quantile of ds in milliseconds (nearest rank); ds is
// sorted in place.
func pct(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	if !slices.IsSorted(ds) {
		slices.Sort(ds)
	}
	i := int(q*float64(len(ds))+0.5) - 1
	i = min(max(i, 0), len(ds)-1)
	return float64(ds[i]) / float64(time.Millisecond)
}

// streamStats summarizes a streaming run.
type streamStats struct {
	Streams int            `json:"streams"`
	OK      int            `json:"ok"`
	Errors  map[string]int `json:"errors,omitempty"`
	// FirstEvent is the time from sending the request to the first event of
	// content; Total until [DONE].
	FirstEventP50 float64 `json:"first_event_p50_ms"`
	FirstEventP99 float64 `json:"first_event_p99_ms"`
	TotalP50      float64 `json:"total_p50_ms"`
	TotalP99      float64 `json:"total_p99_ms"`
	// Delay is, per event, the time from the upstream writing it to the
	// client reading it (bench upstream only: its chunks carry the instant).
	Delays     int     `json:"delay_samples"`
	DelayP50   float64 `json:"event_delay_p50_ms"`
	DelayP99   float64 `json:"event_delay_p99_ms"`
	DelayMax   float64 `json:"event_delay_max_ms"`
	DelayFirst float64 `json:"event_delay_first10_mean_ms"` // mean over each stream's first 10 events
	DelayLast  float64 `json:"event_delay_last10_mean_ms"`  // and over its last 10: no growth along the stream
	MinEvents  int     `json:"min_events"`                  // fewest content events a stream brought
}

// streamOne reads one streamed answer; it records when each data event
// arrived and, for the bench upstream's chunks, how long after it was sent.
type streamResult struct {
	err               string
	firstEvent, total time.Duration
	events            int
	delays            []time.Duration
}

func streamOne(ctx context.Context, client *http.Client, url string, body []byte) streamResult {
	var res streamResult
	t0 := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		res.err = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		res.err = shortError(err.Error())
		return res
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		res.err = fmt.Sprintf("status %d", resp.StatusCode)
		return res
	}
	br := bufio.NewReaderSize(resp.Body, 8192)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			res.err = "stream ended without [DONE]: " + shortError(err.Error())
			return res
		}
		if !bytes.HasPrefix(line, []byte("data: ")) {
			continue
		}
		now := time.Now()
		if res.events == 0 {
			res.firstEvent = now.Sub(t0)
		}
		data := line[len("data: "):]
		if bytes.HasPrefix(data, []byte("[DONE]")) {
			res.total = now.Sub(t0)
			return res
		}
		if bytes.Contains(data, []byte(`"error"`)) {
			res.err = "in-band error event"
			return res
		}
		res.events++
		if sent := sentAt(data); sent > 0 {
			res.delays = append(res.delays, time.Duration(now.UnixNano()-sent))
		}
	}
}

// streams opens n streams at rate per second (each on its own goroutine,
// started on a constant schedule) and waits for them all. sample, when not
// nil, runs every 50 ms while streams are open.
func streams(client *http.Client, url string, body []byte, n int, rate float64, sample func()) streamStats {
	results := make([]streamResult, n)
	var wg sync.WaitGroup
	start := time.Now()
	stop := make(chan struct{})
	if sample != nil {
		go func() {
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					sample()
				case <-stop:
					return
				}
			}
		}()
	}
	ctx := context.Background()
	for i := 0; i < n; i++ {
		if d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = streamOne(ctx, client, url, body)
		}()
	}
	wg.Wait()
	close(stop)

	s := streamStats{Streams: n, Errors: map[string]int{}, MinEvents: -1}
	var first, total, delays []time.Duration
	var firstSum, lastSum time.Duration
	var firstN, lastN int
	for _, r := range results {
		if r.err != "" {
			s.Errors[r.err]++
			continue
		}
		s.OK++
		first = append(first, r.firstEvent)
		total = append(total, r.total)
		delays = append(delays, r.delays...)
		if s.MinEvents < 0 || r.events < s.MinEvents {
			s.MinEvents = r.events
		}
		if k := len(r.delays); k >= 20 {
			for _, d := range r.delays[:10] {
				firstSum += d
			}
			for _, d := range r.delays[k-10:] {
				lastSum += d
			}
			firstN, lastN = firstN+10, lastN+10
		}
	}
	s.FirstEventP50, s.FirstEventP99 = pct(first, 0.5), pct(first, 0.99)
	s.TotalP50, s.TotalP99 = pct(total, 0.5), pct(total, 0.99)
	s.Delays = len(delays)
	s.DelayP50, s.DelayP99, s.DelayMax = pct(delays, 0.5), pct(delays, 0.99), pct(delays, 1)
	if firstN > 0 {
		s.DelayFirst = float64(firstSum) / float64(firstN) / float64(time.Millisecond)
		s.DelayLast = float64(lastSum) / float64(lastN) / float64(time.Millisecond)
	}
	return s
}
