package router

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// A provider (a hostile one, a gateway that reports errors in a 200)
// that puts its key in an answer does not give it to the client: a
// non-stream answer and a stream's events have the deployment's secrets
// (whole, 8 characters or more) replaced, at their length, the rest as
// the provider sent it.
func TestKeyInAnAnswerIsRedacted(t *testing.T) {
	const key = "sk-proj-AnswerEcho0123456789"
	answer := `{"id":"c","object":"chat.completion","model":"up","choices":[{"index":0,"message":{"role":"assistant","content":"your key is ` + key +
		`"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	d := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){reply(200, answer)}})
	d.Secrets = []string{key}
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, chatReq)
	if res.Status != 200 || strings.Contains(string(res.Body), key) || !strings.Contains(string(res.Body), `"content":"your key is [redacted]xxxxxxxxxxxxxxxxxx"`) {
		t.Errorf("expected the 200 with the key redacted, got %d %s", res.Status, res.Body)
	}
	event := `data: {"id":"c","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"content":"key ` + key + `"},"finish_reason":null}]}`
	s := deployment("s", &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, event)}})
	s.Secrets = []string{key}
	res = newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{s}, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil {
		t.Fatalf("expected a stream, got %v", res.Err)
	}
	got, _ := relay(t, res.Stream)
	if all := strings.Join(got, "\n"); strings.Contains(all, key) || !strings.Contains(all, "key [redacted]") {
		t.Errorf("expected the stream's event redacted, got %s", all)
	}
}
