package llmrouter

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// callAs sends one request to h with the client's key.
func callAs(t *testing.T, h *Handler, key, method, path, body string) (int, []byte) {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	r.Header.Set("Authorization", "Bearer "+key)
	w := httptest.NewRecorder()
	_ = h.ServeHTTP(w, r, nil)
	return w.Code, w.Body.Bytes()
}

// keysFile writes a keys file of alice (key sk-alice) and bob (sk-bob).
func keysFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "llm-keys")
	if err := os.WriteFile(path, []byte("alice "+sha("sk-alice")+"\nbob "+sha("sk-bob")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// With consumers, a stored response, a background job and a
// previous_response_id chain are the consumer's that made them: another
// consumer's poll, cancel, delete, input items and continuation get the
// very answer an id nobody made gets (never a hint that it exists), and
// reach no account; the maker's own reach it.
func TestResponsesBelongToTheirConsumer(t *testing.T) {
	a, b := newBGAccount(t, "sk-bg-a", "ca"), newBGAccount(t, "sk-bg-b", "cb")
	h, _ := bgRouter(t, a, b, "keys "+keysFile(t))
	code, body := callAs(t, h, "sk-alice", http.MethodPost, "/v1/responses", `{"model":"ga","input":"Write a novel.","background":true}`)
	id, _ := jsonbody.GetString(body, "id")
	if code != 200 || id == "" {
		t.Fatalf("alice's create: %d %s", code, body)
	}
	const nobody = "resp_nobodys0"
	same := func(what string, code int, body []byte, method, path, reqBody string) {
		t.Helper()
		c2, b2 := callAs(t, h, "sk-bob", method, strings.ReplaceAll(path, id, nobody), strings.ReplaceAll(reqBody, id, nobody))
		if code != c2 || !bytes.Equal(body, bytes.ReplaceAll(b2, []byte(nobody), []byte(id))) {
			t.Errorf("%s: bob got %d %s for alice's response, and %d %s for one nobody made: a hint that it exists", what, code, body, c2, b2)
		}
	}
	hits := func() int {
		return a.count("GET get") + a.count("POST cancel") + a.count("DELETE delete") + a.count("GET input_items") + a.count("GET stream") + a.count("POST create")
	}
	before := hits()
	for _, f := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/" + id},
		{http.MethodGet, "/v1/responses/" + id + "?stream=true&starting_after=1"},
		{http.MethodGet, "/v1/responses/" + id + "/input_items"},
		{http.MethodPost, "/v1/responses/" + id + "/cancel"},
		{http.MethodDelete, "/v1/responses/" + id},
	} {
		code, body := callAs(t, h, "sk-bob", f.method, f.path, "")
		if code != http.StatusNotFound {
			t.Errorf("bob's %s %s: expected 404, got %d %s", f.method, f.path, code, body)
		}
		same(f.method+" "+f.path, code, body, f.method, f.path, "")
	}
	cont := `{"model":"ga","input":"Go on.","previous_response_id":"` + id + `"}`
	code, body = callAs(t, h, "sk-bob", http.MethodPost, "/v1/responses", cont)
	if code != http.StatusBadRequest || !bytes.Contains(body, []byte(`"code":"previous_response_not_found"`)) || !bytes.Contains(body, []byte(`"param":"previous_response_id"`)) {
		t.Errorf("bob's continuation of alice's response: expected OpenAI's 400 previous_response_not_found, got %d %s", code, body)
	}
	same("previous_response_id", code, body, http.MethodPost, "/v1/responses", cont)
	if n := hits() - before; n != 0 {
		t.Errorf("%d of bob's requests on alice's response reached the account", n)
	}
	if n := b.count("POST create"); n != 0 {
		t.Errorf("bob's continuation went to another account (%d creates)", n)
	}
	// alice's own reach it.
	if code, body := callAs(t, h, "sk-alice", http.MethodGet, "/v1/responses/"+id, ""); code != 200 || !bytes.Contains(body, []byte(`"status":"queued"`)) {
		t.Errorf("alice's poll: expected 200 queued, got %d %s", code, body)
	}
	if code, body := callAs(t, h, "sk-alice", http.MethodPost, "/v1/responses", cont); code != 200 {
		t.Errorf("alice's continuation: expected 200, got %d %s", code, body)
	}
	if code, body := callAs(t, h, "sk-alice", http.MethodPost, "/v1/responses/"+id+"/cancel", ""); code != 200 || !bytes.Contains(body, []byte(`"status":"cancelled"`)) {
		t.Errorf("alice's cancel: expected 200 cancelled, got %d %s", code, body)
	}
}

// In fleet mode the owner's consumer is in the fleet's store too: another
// instance refuses another consumer's poll and continuation as it
// refuses an id nobody made, and serves the maker's.
func TestResponsesBelongToTheirConsumerAcrossTheFleet(t *testing.T) {
	m := miniredis.RunT(t)
	a, b := newBGAccount(t, "sk-bg-a", "fa"), newBGAccount(t, "sk-bg-b", "fb")
	keys := keysFile(t)
	h1, _ := bgRouter(t, a, b, "keys "+keys+"\nstore redis redis://"+m.Addr()+"/0 {\n poll_interval 20ms\n}")
	h2, _ := bgRouter(t, a, b, "keys "+keys+"\nstore redis redis://"+m.Addr()+" {\n poll_interval 20ms\n}")
	code, body := callAs(t, h1, "sk-alice", http.MethodPost, "/v1/responses", `{"model":"ga","input":"Write a novel.","background":true}`)
	id, _ := jsonbody.GetString(body, "id")
	if code != 200 || id == "" {
		t.Fatalf("alice's create: %d %s", code, body)
	}
	responseOwners().Remove(id) // h2 is another process: it knows only what Redis knows
	waitForKey(t, m, "resp:")
	if code, body := callAs(t, h2, "sk-bob", http.MethodGet, "/v1/responses/"+id, ""); code != http.StatusNotFound || !bytes.Contains(body, []byte("does not know")) {
		t.Errorf("bob's poll at the other instance: expected the 404 of an unknown id, got %d %s", code, body)
	}
	cont := `{"model":"ga","input":"Go on.","previous_response_id":"` + id + `"}`
	if code, body := callAs(t, h2, "sk-bob", http.MethodPost, "/v1/responses", cont); code != http.StatusBadRequest || !bytes.Contains(body, []byte("previous_response_not_found")) {
		t.Errorf("bob's continuation at the other instance: expected 400 previous_response_not_found, got %d %s", code, body)
	}
	if n := a.count("GET get"); n != 0 {
		t.Errorf("bob's poll reached the account (%d)", n)
	}
	if code, body := callAs(t, h2, "sk-alice", http.MethodGet, "/v1/responses/"+id, ""); code != 200 {
		t.Errorf("alice's poll at the other instance: expected 200, got %d %s", code, body)
	}
}
