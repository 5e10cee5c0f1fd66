package llmrouter

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// pass_through refuses, with a 403 in the client's format and no attempt
// at its provider, what a page on another origin can make a browser send
// without a CORS preflight: a GET, HEAD or POST whose Content-Type, if
// any, a form can send (text/plain, multipart/form-data,
// application/x-www-form-urlencoded), with no key header of its own (a
// browser adds only the Basic credentials it cached), told from other
// clients by Sec-Fetch-Site or, from older browsers, an Origin that is not
// the router's; and a preflight from another origin, whose answer is the
// Caddyfile's to give (the provider's own, Access-Control-Allow-Origin: *,
// would allow any page). An SDK's upload (multipart, with its key in
// Authorization or x-api-key), curl, a same-origin page and a request the
// browser had to preflight (a key header, a JSON body, a DELETE) pass.
func TestPassThroughRefusesUnaskedCrossOriginRequests(t *testing.T) {
	var attempts atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		w.Header().Set("Access-Control-Allow-Origin", "*") // as a provider whose SDK runs in a page answers
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
	}))
	defer upstream.Close()
	h := handlerFromCaddyfile(t, `llm_router {
		pass_through oai
		provider oai {
			type openai
			base_url `+upstream.URL+`/v1
			api_key sk-operator
		}
		model m {
			deployment oai m-up
		}
	}`)
	defer h.Cleanup()

	const evil = "http://evil.example"
	type header = map[string]string
	for _, c := range []struct {
		name, method, path string
		header             header
		refused            bool
	}{
		{"a cross-site form upload", "POST", "/v1/audio/transcriptions",
			header{"Content-Type": "multipart/form-data; boundary=x", "Origin": evil, "Sec-Fetch-Site": "cross-site"}, true},
		{"a text/plain fetch from an older browser", "POST", "/v1/batches", header{"Content-Type": "text/plain;charset=UTF-8", "Origin": evil}, true},
		{"a form post from another port of the host", "POST", "/v1/images/generations",
			header{"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://example.com:8000", "Sec-Fetch-Site": "same-site"}, true},
		{"a cross-site read of the operator's files", "GET", "/v1/files", header{"Origin": evil, "Sec-Fetch-Site": "cross-site"}, true},
		{"a cross-site navigation", "GET", "/v1/files/file-1/content", header{"Sec-Fetch-Site": "cross-site"}, true},
		{"a body without a Content-Type", "POST", "/v1/files", header{"Origin": evil}, true},
		{"a sandboxed page", "POST", "/v1/files", header{"Content-Type": "text/plain", "Origin": "null"}, true},
		{"cached Basic credentials", "POST", "/v1/files",
			header{"Content-Type": "text/plain", "Authorization": "Basic dTpw", "Origin": evil, "Sec-Fetch-Site": "cross-site"}, true},
		{"a malformed Content-Type", "POST", "/v1/files", header{"Content-Type": "text/plain; charset", "Origin": evil}, true},
		{"a cross-origin preflight", "OPTIONS", "/v1/files",
			header{"Origin": evil, "Sec-Fetch-Site": "cross-site", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}, true},
		{"an Anthropic client's form post", "POST", "/v1/messages/batches",
			header{"Content-Type": "text/plain", "Anthropic-Version": "2023-06-01", "Origin": evil}, true},

		{"an SDK's upload", "POST", "/v1/files", header{"Content-Type": "multipart/form-data; boundary=x", "Authorization": "Bearer sk-router"}, false},
		{"curl", "GET", "/v1/files", header{}, false},
		{"a same-origin page", "POST", "/v1/files", header{"Content-Type": "text/plain", "Origin": "http://example.com", "Sec-Fetch-Site": "same-origin"}, false},
		{"the same origin, by Origin alone", "POST", "/v1/files", header{"Content-Type": "text/plain", "Origin": "http://example.com"}, false},
		{"a URL the user typed", "GET", "/v1/files", header{"Sec-Fetch-Site": "none"}, false},
		{"a preflighted Bearer key", "POST", "/v1/files",
			header{"Content-Type": "multipart/form-data; boundary=x", "Authorization": "Bearer sk-router", "Origin": evil, "Sec-Fetch-Site": "cross-site"}, false},
		{"a preflighted x-api-key", "GET", "/v1/files", header{"X-Api-Key": "sk-router", "Origin": evil, "Sec-Fetch-Site": "cross-site"}, false},
		{"a preflighted JSON body", "POST", "/v1/batches", header{"Content-Type": "application/json", "Origin": evil, "Sec-Fetch-Site": "cross-site"}, false},
		{"a preflighted DELETE", "DELETE", "/v1/files/file-1", header{"Origin": evil, "Sec-Fetch-Site": "cross-site"}, false},
	} {
		before := attempts.Load()
		r := httptest.NewRequest(c.method, c.path, strings.NewReader("prompt=spend"))
		for k, v := range c.header {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, r, nil)
		reached := attempts.Load() - before
		if !c.refused {
			if w.Code != 200 || reached != 1 {
				t.Errorf("%s: expected it passed to the provider, got %d after %d attempts: %s", c.name, w.Code, reached, w.Body)
			}
			continue
		}
		var e struct {
			Type  string
			Error struct{ Type, Code, Message string }
		}
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		inFormat := e.Error.Code == "cross_origin_request"
		if c.header["Anthropic-Version"] != "" {
			inFormat = e.Type == "error" && e.Error.Type == "permission_error"
		}
		if w.Code != 403 || reached != 0 || !inFormat || !strings.Contains(e.Error.Message, "CORS") ||
			w.Header().Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("%s: expected a 403 in the client's format and no attempt, got %d after %d attempts: %v %s",
				c.name, w.Code, reached, w.Header(), w.Body)
		}
	}
}
