package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// A client that leaves mid-request or mid-stream cancels the upstream
// request, frees the deployment, and leaves no goroutine behind.
func TestClientLeavesNoGoroutineBehind(t *testing.T) {
	upstreamGone := make(chan struct{}, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte(chunk + "\n\n"))
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done() // until the router cancels
		upstreamGone <- struct{}{}
	}))
	transport := &http.Transport{}
	defer func() {
		srv.Close()
		transport.CloseIdleConnections()
		goleak.VerifyNone(t, goleak.IgnoreCurrent())
	}()
	d := &Deployment{
		Name: "a", Model: "m", Provider: &adapters.OpenAI{Endpoint: provider.Endpoint{BaseURL: srv.URL + "/v1"}},
		Transport: transport, Timeout: time.Minute, TTFTTimeout: time.Minute, IdleTimeout: time.Minute, State: capacity.NewState(),
	}
	r := New()

	// Mid-request: the client goes away while the provider thinks.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *Result)
	go func() { done <- r.Serve(ctx, []*Deployment{d}, chatReq) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if res := <-done; !errors.Is(res.Err, ErrClientGone) {
		t.Errorf("expected ErrClientGone, got %v", res.Err)
	}
	waitGone(t, upstreamGone)

	// Mid-stream: the first chunk arrived, then the client goes away.
	ctx, cancel = context.WithCancel(context.Background())
	res := r.Serve(ctx, []*Deployment{d}, &Request{Request: wire([]byte(`{"model":"x","stream":true,"messages":[]}`), true)})
	if res.Stream == nil {
		t.Fatalf("expected a committed stream, got %v", res.Err)
	}
	relayed := make(chan error)
	go func() {
		relayed <- res.Stream.Relay(func(provider.Event, bool) error { return nil })
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-relayed; err == nil {
		t.Error("expected the relay to end with the client's cancellation")
	}
	waitGone(t, upstreamGone)
	if snap := d.State.Snapshot(time.Now()); snap.InFlight != 0 || snap.ConsecutiveFailures != 0 {
		t.Errorf("a client leaving frees the deployment and is not its failure, got %+v", snap)
	}
}

func waitGone(t *testing.T, gone chan struct{}) {
	t.Helper()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
}
