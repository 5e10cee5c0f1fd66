package mockllm

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// do sends method to path with the mock's key and returns status and body.
func (s *served) do(t *testing.T, method, path, key string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, readAll(t, resp)
}

// A response the mock gave is read back (GET .../responses/{id}) as OpenAI
// keeps it, plain or streamed, and deleted (DELETE), as the SDKs'
// responses.retrieve and responses.delete do; an id it did not give, or a
// deleted one, is OpenAI's 404; a wrong key its 401.
func TestStoredResponsesAreReadAndDeleted(t *testing.T) {
	s := serve(t, Handler{APIKey: "k", Reply: "Stored answer."}, nil)
	var plain struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	body := readAll(t, s.post(t, "/v1/responses", `{"model":"m","input":"hi"}`, "Authorization", "Bearer k"))
	if err := json.Unmarshal([]byte(body), &plain); err != nil || plain.ID == "" {
		t.Fatalf("create: %v %s", err, body)
	}
	code, got := s.do(t, http.MethodGet, "/v1/responses/"+plain.ID, "k")
	if code != 200 || got != body {
		t.Errorf("GET of a plain response: %d %q, want 200 and the body it was created with %q", code, got, body)
	}
	stream := readAll(t, s.post(t, "/v1/responses", `{"model":"m","input":"hi","stream":true}`, "Authorization", "Bearer k"))
	id := stream[strings.Index(stream, `"id":"resp_`)+6:]
	id = id[:strings.IndexByte(id, '"')]
	code, got = s.do(t, http.MethodGet, "/v1/responses/"+id, "k")
	if code != 200 || !strings.Contains(got, `"status":"completed"`) || !strings.Contains(got, "Stored answer.") {
		t.Errorf("GET of a streamed response: %d %s, want 200, completed, with its text", code, got)
	}
	if code, got = s.do(t, http.MethodGet, "/v1/responses/"+id, "wrong"); code != 401 {
		t.Errorf("GET with a wrong key: %d %s, want 401", code, got)
	}
	code, got = s.do(t, http.MethodDelete, "/v1/responses/"+plain.ID, "k")
	if code != 200 || got != `{"id":"`+plain.ID+`","object":"response","deleted":true}` {
		t.Errorf("DELETE: %d %s", code, got)
	}
	for _, id := range []string{plain.ID, "resp_nobodymadeit"} {
		code, got = s.do(t, http.MethodGet, "/v1/responses/"+id, "k")
		if code != 404 || !strings.Contains(got, `"message":"Response with id '`+id+`' not found."`) {
			t.Errorf("GET of %s: %d %s, want OpenAI's 404", id, code, got)
		}
	}
	if code, got = s.do(t, http.MethodDelete, "/v1/responses/"+plain.ID, "k"); code != 404 {
		t.Errorf("a second DELETE: %d %s, want 404", code, got)
	}
	cont := `{"model":"m","input":"more","previous_response_id":"` + plain.ID + `"}`
	if resp := s.post(t, "/v1/responses", cont, "Authorization", "Bearer k"); resp.StatusCode != 400 {
		t.Errorf("continuing a deleted response: %d %s, want 400", resp.StatusCode, readAll(t, resp))
	}
}
