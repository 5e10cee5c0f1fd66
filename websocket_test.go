package llmrouter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// An upgrade to WebSocket mode that the router does not serve is answered
// 426 Upgrade Required with an error in OpenAI's format, which Codex CLI
// takes as "fall back to HTTP" at once (a 405 it retries: issue 29).
func TestWebSocketUpgradeRefusedWith426(t *testing.T) {
	t.Setenv("LLM_ROUTER_TEST_KEY", "sk-from-env")
	h := handlerFromJSON(t, jsonConfig)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	req := httptest.NewRequest(http.MethodGet, "/v1/responses", nil)
	req.Header.Set("Connection", "keep-alive, Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, req, nil); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusUpgradeRequired ||
		body.Error.Code != "websocket_not_supported" || body.Error.Type != "invalid_request_error" || body.Error.Message == "" {
		t.Errorf("expected 426 with an OpenAI error, got %d %s", rec.Code, rec.Body)
	}
}

// fakeResponses is an OpenAI account's POST /v1/responses: each request
// counted, answered with the 429 of testdata/websocket/openai-429-rpm.http
// while fail429 is positive, else with a stream of the Responses API's
// events whose text is text.
type fakeResponses struct {
	mu       sync.Mutex
	attempts int
	fail429  int
	text     string
	bodies   []map[string]any
	// hang, when set, has the stream stop after response.created until
	// the router gives up the request, and is closed then.
	hang chan struct{}
}

func (f *fakeResponses) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	f.mu.Lock()
	f.attempts++
	f.bodies = append(f.bodies, body)
	fail, hang := f.fail429 > 0, f.hang
	f.mu.Unlock()
	if hang != nil {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_hang\",\"status\":\"in_progress\",\"output\":[]}}\n\n"+
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hel\"}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(hang)
		return
	}
	f.mu.Lock()
	f.fail429--
	f.mu.Unlock()
	if r.URL.Path != "/v1/responses" {
		http.NotFound(w, r)
		return
	}
	if fail {
		raw, err := os.ReadFile("testdata/websocket/openai-429-rpm.http")
		if err != nil {
			panic(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), r)
		if err != nil {
			panic(err)
		}
		maps.Copy(w.Header(), res.Header)
		w.WriteHeader(res.StatusCode)
		_, _ = io.Copy(w, res.Body)
		return
	}
	id := fmt.Sprintf("resp_%s_%d", strings.ReplaceAll(f.text, " ", ""), f.attempts)
	w.Header().Set("Content-Type", "text/event-stream")
	for i, ev := range []string{
		`{"type":"response.created","sequence_number":0,"response":{"id":"` + id + `","object":"response","status":"in_progress","output":[]}}`,
		`{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":` + strconv.Quote(f.text) + `}`,
		`{"type":"response.completed","sequence_number":2,"response":{"id":"` + id + `","object":"response","status":"completed","output":[{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":` + strconv.Quote(f.text) + `}]}],"usage":{"input_tokens":5,"output_tokens":3,"total_tokens":8}}}`,
	} {
		t := []string{"response.created", "response.output_text.delta", "response.completed"}[i]
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", t, ev)
	}
}

// wsRouter is a router over two OpenAI accounts a (preferred) and b, in
// model group m, behind a real HTTP server; its ws:// URL of .../responses.
func wsRouter(t *testing.T, a, b *fakeResponses) string {
	t.Helper()
	ua, ub := httptest.NewServer(a), httptest.NewServer(b)
	t.Cleanup(ua.Close)
	t.Cleanup(ub.Close)
	h := handlerFromJSON(t, `{"providers": {
		"a": {"type": "openai", "base_url": "`+ua.URL+`/v1", "api_key": "sk-a", "responses": "native"},
		"b": {"type": "openai", "base_url": "`+ub.URL+`/v1", "api_key": "sk-b", "responses": "native"}},
	"models": {"m": {"deployments": [{"provider": "a", "model": "ma", "quality": 1}, {"provider": "b", "model": "mb", "quality": 0.5}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = h.ServeHTTP(w, r, nil)
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/responses"
}

// wsTurn sends msg on c and reads the turn's events up to its last
// (response.completed, response.failed or error).
func wsTurn(t *testing.T, c *websocket.Conn, msg string) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	var events []map[string]any
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("after %v: %v", events, err)
		}
		var ev map[string]any
		if typ != websocket.MessageText || json.Unmarshal(data, &ev) != nil {
			t.Fatalf("expected a JSON text message, got %v %q", typ, data)
		}
		events = append(events, ev)
		switch ev["type"] {
		case "response.completed", "response.failed", "error":
			return events
		}
	}
}

func wsDial(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, res, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer client-key"}}})
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, res)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func eventTypes(events []map[string]any) []string {
	var out []string
	for _, ev := range events {
		out = append(out, ev["type"].(string))
	}
	return out
}

// Two turns on one socket, each a response.create routed as a streamed
// POST .../responses: the provider's events come back one a message, and
// the provider got the body without the event's type, streamed.
func TestWebSocketModeTurns(t *testing.T) {
	a, b := &fakeResponses{text: "From a."}, &fakeResponses{text: "From b."}
	c := wsDial(t, wsRouter(t, a, b))
	for i, input := range []string{"Say hi", "Again"} {
		evs := wsTurn(t, c, `{"type":"response.create","model":"m","store":false,"input":`+strconv.Quote(input)+`}`)
		if got := eventTypes(evs); !slices.Equal(got, []string{"response.created", "response.output_text.delta", "response.completed"}) || evs[1]["delta"] != "From a." {
			t.Errorf("turn %d: expected a's three events, got %v", i+1, evs)
		}
	}
	if a.attempts != 2 || b.attempts != 0 {
		t.Errorf("expected 2 attempts at a and none at b, got %d and %d", a.attempts, b.attempts)
	}
	for _, body := range a.bodies {
		if _, ok := body["type"]; ok || body["stream"] != true || body["model"] != "ma" {
			t.Errorf("expected a streamed body without type, got %v", body)
		}
	}
}

// A turn whose preferred deployment answers 429 before its first event is
// served by the other, on the same socket: the client sees only b's events.
func TestWebSocketModeFailoverBeforeTheFirstEvent(t *testing.T) {
	a, b := &fakeResponses{text: "From a.", fail429: 1}, &fakeResponses{text: "From b."}
	c := wsDial(t, wsRouter(t, a, b))
	evs := wsTurn(t, c, `{"type":"response.create","model":"m","input":"Say hi"}`)
	if got := eventTypes(evs); !slices.Equal(got, []string{"response.created", "response.output_text.delta", "response.completed"}) || evs[1]["delta"] != "From b." {
		t.Errorf("expected b's three events, got %v", evs)
	}
	if a.attempts != 1 || b.attempts != 1 {
		t.Errorf("expected one attempt at each, got %d and %d", a.attempts, b.attempts)
	}
}

// A turn the router refuses is an error event in OpenAI's WebSocket shape
// ({"type":"error","status":...,"error":{...}}), and the socket serves the
// next turn.
func TestWebSocketModeErrors(t *testing.T) {
	a, b := &fakeResponses{text: "From a."}, &fakeResponses{text: "From b."}
	c := wsDial(t, wsRouter(t, a, b))
	for _, tc := range []struct {
		msg, code string
		status    float64
	}{
		{`{"type":"response.create","model":"nope","input":"Say hi"}`, "model_not_found", 404},
		{`{"type":"response.append","model":"m","input":"Say hi"}`, "invalid_value", 400},
		{`{"type":"response.create","model":"m","input":"Say hi","background":true}`, "invalid_value", 400},
		{`{"type":"response.create","model":"m"}`, "missing_required_parameter", 400},
		{`[1]`, "invalid_json", 400},
	} {
		evs := wsTurn(t, c, tc.msg)
		e, _ := evs[0]["error"].(map[string]any)
		if len(evs) != 1 || evs[0]["type"] != "error" || evs[0]["status"] != tc.status || e["code"] != tc.code || e["message"] == "" {
			t.Errorf("%s: expected one error event %v %s, got %v", tc.msg, tc.status, tc.code, evs)
		}
	}
	evs := wsTurn(t, c, `{"type":"response.create","model":"m","input":"Say hi"}`)
	if evs[len(evs)-1]["type"] != "response.completed" || a.attempts != 1 {
		t.Errorf("expected the socket to serve a turn after the errors, got %v (%d attempts)", evs, a.attempts)
	}
}

// Codex CLI's turns on a socket, as OpenAI serves them with store false
// (the socket keeps its last response): a warm-up (generate false) is
// answered by the router, no provider asked; the next turn names it as
// previous_response_id with only the new items, and the one after names
// that turn's response with its tool output. Each reaches the provider
// whole: the socket's items before the new ones, no previous_response_id
// (which no provider knows of a store false response), no generate.
func TestWebSocketModeKeepsTheLastResponse(t *testing.T) {
	a, b := &fakeResponses{text: "From a."}, &fakeResponses{text: "From b."}
	c := wsDial(t, wsRouter(t, a, b))
	const user = `{"type":"message","role":"user","content":[{"type":"input_text","text":"Say hi"}]}`
	evs := wsTurn(t, c, `{"type":"response.create","model":"m","store":false,"generate":false,"input":[`+user+`]}`)
	warm, _ := evs[len(evs)-1]["response"].(map[string]any)
	if got := eventTypes(evs); !slices.Equal(got, []string{"response.created", "response.completed"}) || warm["id"] == "" || a.attempts != 0 {
		t.Fatalf("expected the warm-up answered with no attempt, got %v (%d attempts)", evs, a.attempts)
	}
	evs = wsTurn(t, c, `{"type":"response.create","model":"m","store":false,"generate":false,"previous_response_id":"`+warm["id"].(string)+`","input":[]}`)
	first, _ := evs[len(evs)-1]["response"].(map[string]any)
	if first["status"] != "completed" || a.attempts != 0 {
		t.Fatalf("expected a second warm-up answered too, got %v", evs)
	}
	evs = wsTurn(t, c, `{"type":"response.create","model":"m","store":false,"previous_response_id":"`+first["id"].(string)+`","input":[]}`)
	done, _ := evs[len(evs)-1]["response"].(map[string]any)
	const out = `{"type":"function_call_output","call_id":"call_1","output":"ok"}`
	evs = wsTurn(t, c, `{"type":"response.create","model":"m","store":false,"previous_response_id":"`+done["id"].(string)+`","input":[`+out+`]}`)
	if evs[len(evs)-1]["type"] != "response.completed" || a.attempts != 2 {
		t.Fatalf("expected two turns at a, got %v (%d attempts)", evs, a.attempts)
	}
	var answer map[string]any
	_ = json.Unmarshal([]byte(`{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"From a."}]}`), &answer)
	var u, o map[string]any
	_ = json.Unmarshal([]byte(user), &u)
	_ = json.Unmarshal([]byte(out), &o)
	for i, want := range [][]any{{u}, {u, answer, o}} {
		body := a.bodies[i]
		if _, ok := body["previous_response_id"]; ok || body["generate"] != nil || !reflect.DeepEqual(body["input"], want) {
			t.Errorf("turn %d: expected input %v and no previous_response_id nor generate, got %v", i+1, want, body)
		}
	}
}

// A client that goes away in the middle of a turn ends the turn: the
// provider's request is given up, not read to its end.
func TestWebSocketModeClientGoneMidTurn(t *testing.T) {
	a, b := &fakeResponses{text: "From a.", hang: make(chan struct{})}, &fakeResponses{text: "From b."}
	c := wsDial(t, wsRouter(t, a, b))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"response.create","model":"m","input":"Say hi"}`)); err != nil {
		t.Fatal(err)
	}
	if _, data, err := c.Read(ctx); err != nil || !strings.Contains(string(data), "response.created") {
		t.Fatalf("expected response.created, got %q %v", data, err)
	}
	_ = c.Close(websocket.StatusGoingAway, "")
	select {
	case <-a.hang:
	case <-time.After(3 * time.Second):
		t.Fatal("the provider's request went on after the client left")
	}
}

// A turn that continues a response the socket does not hold (the
// provider's, by its previous_response_id) keeps it; the next turn, which
// continues that turn, is not expanded from the socket (which holds only
// part of the conversation), and goes to the provider as the client sent it.
func TestWebSocketModeLeavesTheProvidersState(t *testing.T) {
	a, b := &fakeResponses{text: "From a."}, &fakeResponses{text: "From b."}
	c := wsDial(t, wsRouter(t, a, b))
	evs := wsTurn(t, c, `{"type":"response.create","model":"m","previous_response_id":"resp_elsewhere","input":"One"}`)
	first, _ := evs[len(evs)-1]["response"].(map[string]any)
	evs = wsTurn(t, c, `{"type":"response.create","model":"m","previous_response_id":"`+first["id"].(string)+`","input":"Two"}`)
	if evs[len(evs)-1]["type"] != "response.completed" || a.attempts != 2 {
		t.Fatalf("expected two turns at a, got %v (%d attempts)", evs, a.attempts)
	}
	for i, want := range []string{"resp_elsewhere", first["id"].(string)} {
		if body := a.bodies[i]; body["previous_response_id"] != want || len(body) == 0 || body["input"] != []string{"One", "Two"}[i] {
			t.Errorf("turn %d: expected previous_response_id %s and the input as sent, got %v", i+1, want, body)
		}
	}
}
