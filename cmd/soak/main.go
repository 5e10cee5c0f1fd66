// Command soak drives requests through llm_router in front of four
// misbehaving fake providers and prints what clients saw; it exits 1 when a
// 429 surfaced, an answer overran the deadline or a truncated answer looked
// complete. See package soak.
//
//	go run ./cmd/soak -n 20000 -c 200
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/llmrouter/caddy-llm-router/internal/soak"
)

func main() {
	o := soak.DefaultOptions
	flag.IntVar(&o.Requests, "n", o.Requests, "requests to send (half of them streamed)")
	flag.IntVar(&o.Concurrency, "c", o.Concurrency, "clients sending at once")
	flag.DurationVar(&o.Deadline, "deadline", o.Deadline, "the router's deadline")
	flag.IntVar(&o.Port, "port", o.Port, "router port; the four mocks take the next ports")
	flag.StringVar(&o.Resume, "resume", o.Resume, "the router's resume mode for broken streams: any, same_model or off")
	flag.Parse()
	res, err := soak.Run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(res)
	if !res.OK() {
		fmt.Println("FAIL: a count that must be 0 is not")
		os.Exit(1)
	}
}
