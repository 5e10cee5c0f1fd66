package llmrouter

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// flushRecorder is a client's ResponseWriter that keeps what each Flush
// sent: the writes since the one before.
type flushRecorder struct {
	mu      sync.Mutex
	header  http.Header
	status  int
	pending bytes.Buffer
	flushes []string
}

func (f *flushRecorder) Header() http.Header { return f.header }
func (f *flushRecorder) WriteHeader(status int) {
	if f.status == 0 {
		f.status = status
	}
}

func (f *flushRecorder) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.WriteHeader(http.StatusOK)
	return f.pending.Write(p)
}

func (f *flushRecorder) Flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending.Len() > 0 {
		f.flushes = append(f.flushes, f.pending.String())
		f.pending.Reset()
	}
}

// sent reports whether a flush sent s.
func (f *flushRecorder) sent(s string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Contains(strings.Join(f.flushes, ""), s)
}

// chunk is an OpenAI chat.completion.chunk event of content text.
func chunk(text, finish string) string {
	delta, reason := fmt.Sprintf(`{"content":%q}`, text), "null"
	if finish != "" {
		delta, reason = `{}`, fmt.Sprintf("%q", finish)
	}
	return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1755780000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":` +
		delta + `,"logprobs":null,"finish_reason":` + reason + `}]}` + "\n\n"
}

// Events that arrive together from the provider reach the client in one
// write (as reverse_proxy copies what one read brought), and whatever was
// written reaches the client before the router waits for the provider: the
// provider sends two events at once, then waits until the client has the
// second before it sends the rest.
func TestStreamEventsArrivingTogetherGoInOneFlush(t *testing.T) {
	w := &flushRecorder{header: http.Header{}}
	waited := make(chan bool, 1)
	up := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = rw.Write([]byte(chunk("Alpha", "") + chunk("Beta", "")))
		rw.(http.Flusher).Flush()
		deadline := time.Now().Add(5 * time.Second)
		for !w.sent("Beta") && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		waited <- w.sent("Beta")
		_, _ = rw.Write([]byte(chunk("Gamma", "") + chunk("", "stop") + "data: [DONE]\n\n"))
	}))
	defer up.Close()
	h := streamHandler(t, up.URL)
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	r.Header.Set("Content-Type", "application/json")
	if err := h.ServeHTTP(w, r.WithContext(context.Background()), nil); err != nil {
		t.Fatal(err)
	}
	if !<-waited {
		t.Fatalf("the second event did not reach the client while the router waited for the provider: %q, unflushed %q", w.flushes, w.pending.String())
	}
	if w.status != http.StatusOK || len(w.flushes) == 0 {
		t.Fatalf("status %d, flushes %q", w.status, w.flushes)
	}
	if first := w.flushes[0]; !strings.Contains(first, "Alpha") || !strings.Contains(first, "Beta") {
		t.Errorf("the two events that arrived together took %d flushes, want 1: %q", len(w.flushes), w.flushes)
	}
	if all := strings.Join(w.flushes, ""); !strings.Contains(all, "Gamma") || !strings.HasSuffix(all, "data: [DONE]\n\n") || w.pending.Len() > 0 {
		t.Errorf("the stream's end: flushes %q, unflushed %q", w.flushes, w.pending.String())
	}
}
