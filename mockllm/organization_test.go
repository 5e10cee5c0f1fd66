package mockllm

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// A mock of an Organization answers with a reasoning item first, its
// encrypted_content sealed to that organization (in the response, and in
// a stream's output_item.done and response.completed), and refuses an
// input item another organization sealed with OpenAI's 400
// invalid_encrypted_content.
func TestOrganizationMintsAndChecksReasoning(t *testing.T) {
	serve := func(org string) *httptest.Server {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_mock {\n organization " + org + "\n }")); err != nil {
			t.Fatal(err)
		}
		if err := h.Setup(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		srv := httptest.NewServer(h.HTTPHandler())
		t.Cleanup(srv.Close)
		return srv
	}
	a, b := serve("org-a"), serve("org-b")
	post := func(srv *httptest.Server, body string) (int, string) {
		resp, err := srv.Client().Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, readAll(t, resp)
	}
	code, body := post(a, `{"model":"m","input":"hi"}`)
	var r struct {
		Output []json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal([]byte(body), &r); code != 200 || err != nil || len(r.Output) != 2 ||
		!strings.Contains(string(r.Output[0]), `"type":"reasoning"`) || !strings.Contains(string(r.Output[0]), `"encrypted_content":"gAAAA`) {
		t.Fatalf("expected a reasoning item, then the message: %d %s", code, body)
	}
	turn := `{"model":"m","input":[{"type":"message","role":"user","content":"hi"},` + string(r.Output[0]) + `]}`
	if code, body := post(a, turn); code != 200 {
		t.Errorf("its own item: %d %s", code, body)
	}
	code, body = post(b, turn)
	if code != 400 || !strings.Contains(body, `"code":"invalid_encrypted_content"`) || !strings.Contains(body, "The encrypted content gAAA...") {
		t.Errorf("another organization's item: %d %s", code, body)
	}
	_, stream := post(a, `{"model":"m","input":"hi","stream":true}`)
	if strings.Count(stream, `"encrypted_content":"gAAAA`) != 2 || !strings.Contains(stream, `"output_index":1`) {
		t.Errorf("expected the reasoning item in output_item.done and response.completed, the message at index 1: %s", stream)
	}
}
