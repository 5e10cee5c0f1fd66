package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// endless streams content chunks until its body is closed, which it
// reports on closed.
func endless(closed chan<- struct{}) func(*http.Request) (*http.Response, error) {
	return func(req *http.Request) (*http.Response, error) {
		pr, pw := io.Pipe()
		go func() {
			defer close(closed)
			for {
				if _, err := pw.Write([]byte(chunk + "\n\n")); err != nil {
					return
				}
			}
		}()
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr, Request: req}, nil
	}
}

// A provider that streams without end: the router relays MaxStreamBytes
// of it at most, then ends the client's stream with an in-band error that
// says so (never a terminator), closes the upstream, and spends what was
// relayed (estimated: the provider stated no usage); the deployment is not
// failed for it. Each resume mode alike: the bound is not a failure that
// another attempt could take up.
func TestAStreamIsCutAtMaxStreamBytes(t *testing.T) {
	for _, mode := range []ResumeMode{ResumeOff, ResumeSameModel} {
		closed := make(chan struct{})
		d := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){endless(closed)}})
		r := newRouter(newFakeClock())
		r.MaxStreamBytes, r.Resume = 4096, mode
		req := &Request{Request: wire(chatReq.Body, true), Tokens: 10, PromptTokens: 8}
		res := r.Serve(context.Background(), []*Deployment{d}, req)
		if res.Stream == nil {
			t.Fatalf("mode %v: expected a committed stream, got %v", mode, res.Err)
		}
		relayed := 0
		err := res.Stream.Relay(func(ev provider.Event, done bool) error {
			if done {
				t.Errorf("mode %v: a cut stream must not end with its terminator", mode)
			}
			if relayed += len(ev.Data); relayed > 1<<20 {
				return errors.New("relayed past 1 MiB")
			}
			return nil
		})
		var se *StreamError
		if !errors.As(err, &se) || !se.Bounded || !strings.Contains(se.Message, "max_stream_bytes") || !strings.Contains(se.Message, "4096") {
			t.Fatalf("mode %v: expected the bound's StreamError, got %#v", mode, err)
		}
		if relayed > 4096 || relayed < 4096-len(chunk) {
			t.Errorf("mode %v: expected about 4096 bytes relayed, got %d", mode, relayed)
		}
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatalf("mode %v: the upstream stream was not closed", mode)
		}
		u, ok := res.Stream.Usage()
		spent := d.State.Usage(time.Now()).Total
		if !ok || u.InputTokens != 8 || u.OutputTokens < 2 || spent.Answers != 1 || spent.Usage != u {
			t.Errorf("mode %v: expected the relayed answer's estimate spent (8 in, some out), got %+v %v, spent %+v", mode, u, ok, spent)
		}
		if snap := d.State.Snapshot(time.Now()); snap.ConsecutiveFailures != 0 {
			t.Errorf("mode %v: the bound is no failure of the deployment, got %d failures", mode, snap.ConsecutiveFailures)
		}
		if n := res.Stream.Resumes(); n != 0 {
			t.Errorf("mode %v: expected no resume, got %d", mode, n)
		}
	}
}

// New bounds a stream at DefaultMaxStreamBytes, 64 MiB.
func TestTheStreamBoundDefaultsTo64MiB(t *testing.T) {
	if got := New().MaxStreamBytes; got != 64<<20 || DefaultMaxStreamBytes != 64<<20 {
		t.Errorf("expected 64 MiB, got %d (DefaultMaxStreamBytes %d)", got, DefaultMaxStreamBytes)
	}
}
