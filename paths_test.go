package llmrouter

import (
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/api"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/endpoints.md's table from api.Endpoints")

// unserved is what the 404 of a path the router does not serve begins with.
const unserved = "llm_router does not serve"

// TestEveryEndpointIsServed: the table of served paths (api.Endpoints) is
// what the handler answers: each method of each endpoint gets the
// endpoint's own answer (a 400 for an empty body, the model list, a
// response the router does not know...), never the 404 of an unserved
// path, under any prefix; another method, or another path, gets that 404,
// which lists every endpoint.
func TestEveryEndpointIsServed(t *testing.T) {
	h := handlerFromJSON(t, `{"providers":{"p":{"type":"openai","base_url":"http://127.0.0.1:1/v1","api_key":"sk-p"}},
		"models":{"m":{"deployments":[{"provider":"p","model":"x"}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	serve := func(method, path string, upgrade bool) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(`{}`))
		r.Header.Set("Content-Type", "application/json")
		if upgrade {
			r.Header.Set("Connection", "Upgrade")
			r.Header.Set("Upgrade", "websocket")
			r.Header.Set("Sec-WebSocket-Version", "13")
			r.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		}
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, r, nil)
		return w
	}
	for _, e := range api.Endpoints {
		path := strings.ReplaceAll(e.Path, "{id}", "resp_1")
		for _, prefix := range []string{"/v1", "/openai/v1"} {
			for _, m := range e.Methods {
				if w := serve(m, prefix+path, e.Upgrade); strings.Contains(w.Body.String(), unserved) {
					t.Errorf("%s %s%s: expected the endpoint's answer, got the unserved 404 %d %s", m, prefix, path, w.Code, w.Body)
				}
			}
		}
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodPost, "/v1/images/generations"}, {http.MethodPut, "/v1/models"}, {http.MethodPost, "/v1/responses/resp_1/stop"},
	} {
		w := serve(c.method, c.path, false)
		if w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), unserved) {
			t.Errorf("%s %s: expected the unserved 404, got %d %s", c.method, c.path, w.Code, w.Body)
		}
		for _, e := range api.Endpoints {
			if !strings.Contains(w.Body.String(), e.Request()) {
				t.Errorf("%s %s: expected the 404 to list %s, got %s", c.method, c.path, e.Request(), w.Body)
			}
		}
	}
}

// TestEndpointsDoc: docs/endpoints.md holds the table of served paths as
// api.Endpoints makes it (go test -run TestEndpointsDoc -update rewrites
// it).
func TestEndpointsDoc(t *testing.T) {
	const begin, end = "<!-- endpoints: made from api.Endpoints by TestEndpointsDoc -->\n", "<!-- end of endpoints -->\n"
	path := filepath.Join("docs", "endpoints.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i, j := strings.Index(string(doc), begin), strings.Index(string(doc), end)
	if i < 0 || j < i {
		t.Fatalf("%s: expected the table between %q and %q", path, begin, end)
	}
	table := api.EndpointsTable()
	if got := string(doc[i+len(begin) : j]); got != table {
		if *updateDocs {
			if err := os.WriteFile(path, []byte(string(doc[:i+len(begin)])+table+string(doc[j:])), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("%s: the table is not api.Endpoints' (rerun with -update):\n%s\nexpected:\n%s", path, got, table)
	}
}
