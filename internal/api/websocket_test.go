package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
)

// A socket's message is a response.create text message holding a JSON
// object; its body is the POST's, without type and streamed; anything
// else is a 400 naming what is wrong, in the Responses API's terms.
func TestWSTurnBody(t *testing.T) {
	body, e := WSTurnBody(true, []byte(`{"type":"response.create","model":"m","input":"hi"}`))
	if e != nil {
		t.Fatalf("error %+v", e)
	}
	jsontest.Same(t, body, `{"model":"m","input":"hi","stream":true}`)
	for _, c := range []struct {
		text       bool
		msg, param string
		code       Code
	}{
		{false, `{"type":"response.create"}`, "", InvalidJSON},
		{true, `[1]`, "", InvalidJSON},
		{true, `{"type":`, "", InvalidJSON},
		{true, `{"type":"response.cancel"}`, "type", InvalidValue},
		{true, `{"type":"response.create","background":true}`, "background", InvalidValue},
	} {
		_, e := WSTurnBody(c.text, []byte(c.msg))
		if e == nil || e.Status != http.StatusBadRequest || e.Code != c.code || e.Param != c.param {
			t.Errorf("%s: got %+v, want 400 %v param %q", c.msg, e, c.code, c.param)
		}
	}
}

// A turn that names the socket's last response is sent whole: the last
// turn's input, its output, then the new input, without
// previous_response_id; one naming another response is left as it is,
// and forgets the socket's.
func TestWSSessionExpandsTheLastResponse(t *testing.T) {
	var s WSSession
	first := []byte(`{"model":"m","input":"hi"}`)
	s.Remember(first, []byte(`{"type":"response.completed","response":{"id":"resp_1","output":[{"type":"message","role":"assistant","content":[]}]}}`))
	got, e := s.Expand([]byte(`{"model":"m","previous_response_id":"resp_1","input":[{"type":"message","role":"user","content":"again"}]}`))
	if e != nil {
		t.Fatal(e)
	}
	jsontest.Same(t, got, `{"model":"m","input":[{"type":"message","role":"user","content":"hi"},{"type":"message","role":"assistant","content":[]},{"type":"message","role":"user","content":"again"}]}`)
	other := []byte(`{"model":"m","previous_response_id":"resp_9","input":"x"}`)
	if got, _ := s.Expand(other); string(got) != string(other) {
		t.Errorf("another response's turn changed: %s", got)
	}
	s.Remember(other, []byte(`{"type":"response.completed","response":{"id":"resp_10","output":[]}}`))
	if got, _ := s.Expand([]byte(`{"previous_response_id":"resp_1","input":"x"}`)); jsontest.Field(t, got, "previous_response_id") != "resp_1" {
		t.Errorf("the socket still expands from resp_1 after a turn on the provider's state: %s", got)
	}
	if _, e := s.Expand([]byte(`{"previous_response_id":"","input":7}`)); e != nil {
		t.Errorf("a turn naming no response was read: %+v", e)
	}
}

// An error answer becomes OpenAI's WebSocket error event with its status;
// a body with no error object is the router's 502.
func TestWSError(t *testing.T) {
	jsontest.Same(t, WSError(429, []byte(`{"error":{"type":"rate_limit_error","message":"slow"}}`)),
		`{"type":"error","status":429,"error":{"type":"rate_limit_error","message":"slow"}}`)
	jsontest.Same(t, WSError(200, []byte(`not json`)),
		`{"type":"error","status":502,"error":{"type":"server_error","code":"upstream_unavailable","message":"the deployment's answer was not a Responses stream","param":null}}`)
	if _, ok := WSCompleted([]byte(`{"id":`)); ok {
		t.Error("an answer that is not JSON was completed")
	}
	ev, _ := WSCompleted([]byte(`{"id":"resp_1"}`))
	if !IsCompletedEvent(ev) {
		t.Errorf("%s is not a response.completed", ev)
	}
	created, completed := WarmupEvents([]byte(`{"model":"m","generate":false}`), time.Unix(1700000000, 0))
	if jsontest.Field(t, created, "type") != "response.created" || !IsCompletedEvent(completed) {
		t.Errorf("warm-up events %s, %s", created, completed)
	}
}

// A stream's last event carries the response; its status says whether
// the response is done.
func TestTerminalResponse(t *testing.T) {
	for _, typ := range []string{"response.completed", "response.failed", "response.incomplete", "response.cancelled"} {
		r, ok := TerminalResponse([]byte(`{"type":"` + typ + `","response":{"status":"completed"}}`))
		if !ok || !ResponseDone(r) {
			t.Errorf("%s: %s %v", typ, r, ok)
		}
	}
	if _, ok := TerminalResponse([]byte(`{"type":"response.output_text.delta","response":{}}`)); ok {
		t.Error("a delta ended the response")
	}
	for status, done := range map[string]bool{"queued": false, "in_progress": false, "completed": true, "failed": true, "incomplete": true, "cancelled": true} {
		if ResponseDone([]byte(`{"status":"`+status+`"}`)) != done {
			t.Errorf("status %s: done %v", status, !done)
		}
	}
}

// A turn's POST has no generate (the socket's own field); a warm-up is a
// generate false turn.
func TestWSPostBody(t *testing.T) {
	body := []byte(`{"model":"m","generate":false,"input":"hi"}`)
	if !IsWarmup(body) || IsWarmup([]byte(`{"generate":true}`)) || IsWarmup([]byte(`{}`)) {
		t.Error("warm-up misread")
	}
	jsontest.Same(t, WSPostBody(body), `{"model":"m","input":"hi"}`)
}
