package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// WebSocket mode through a real Caddy: one socket, a response.create
// turn served by b while a fails (failover before the first event), the
// events one a message; a second turn continuing the first by its id with
// only the new input, sent to the provider whole; and a refused turn as an
// error event, the socket kept.
func TestResponsesWebSocketMode(t *testing.T) {
	load(t, nativeResponses("ws", "ws-a", "ws-b"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, res, err := websocket.Dial(ctx, "ws://localhost:9080/v1/responses",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer client-key"}}})
	if err != nil {
		t.Fatalf("dial: %v %v", err, res)
	}
	defer c.CloseNow()
	turn := func(msg string) (types []string, text string, last map[string]any) {
		t.Helper()
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("after %v: %v", types, err)
			}
			var ev map[string]any
			if err := json.Unmarshal(data, &ev); err != nil {
				t.Fatalf("not JSON: %q", data)
			}
			typ, _ := ev["type"].(string)
			types = append(types, typ)
			if d, ok := ev["delta"].(string); ok && typ == "response.output_text.delta" {
				text += d
			}
			if typ == "response.completed" || typ == "response.failed" || typ == "error" {
				return types, text, ev
			}
		}
	}
	types, text, last := turn(`{"type":"response.create","model":"ws","store":false,"input":"Say hello."}`)
	if text != "Hello from b." || types[0] != "response.created" || last["type"] != "response.completed" {
		t.Fatalf("expected b's stream, got %v %q", types, text)
	}
	if s := stats(t, 9082); s.Requests != 1 || !strings.Contains(s.LastBody, `"stream":true`) || strings.Contains(s.LastBody, "response.create") {
		t.Errorf("expected b asked once, streamed, without the event's type: %d %s", s.Requests, s.LastBody)
	}
	id := last["response"].(map[string]any)["id"].(string)
	_, _, last = turn(`{"type":"response.create","model":"ws","store":false,"previous_response_id":"` + id + `","input":"And again."}`)
	if last["type"] != "response.completed" {
		t.Fatalf("expected the second turn completed, got %v", last)
	}
	a, b := stats(t, 9081), stats(t, 9082)
	body := b.LastBody // the second turn's, wherever it went
	if strings.Contains(a.LastBody, "And again.") {
		body = a.LastBody
	}
	if !strings.Contains(body, "Say hello.") || !strings.Contains(body, "Hello from b.") || !strings.Contains(body, "And again.") || strings.Contains(body, "previous_response_id") {
		t.Errorf("expected the second turn sent whole, got %s", body)
	}
	types, _, last = turn(`{"type":"response.create","model":"nope","input":"Hi."}`)
	if len(types) != 1 || last["type"] != "error" || last["status"] != 404.0 {
		t.Errorf("expected one error event with status 404, got %v %v", types, last)
	}
	if _, text, _ = turn(`{"type":"response.create","model":"ws","input":"Once more."}`); text == "" {
		t.Errorf("expected the socket to serve a turn after the error")
	}
	_ = c.Close(websocket.StatusNormalClosure, "")
}
