package llmrouter

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A client's path goes under the provider's base path after the client's
// API root, found by the base path's last segment.
func TestPassPath(t *testing.T) {
	for _, c := range []struct{ base, path, want string }{
		{"/v1", "/v1/audio/speech", "/v1/audio/speech"},
		{"/api/v1", "/v1/audio/speech", "/api/v1/audio/speech"},
		{"/openai/v1", "/v1/files/file-1/content", "/openai/v1/files/file-1/content"},
		{"/v1beta", "/v1beta/files", "/v1beta/files"},
		{"/v1", "/proxy/v1/batches", "/v1/batches"},
		{"/v1", "/v10/x", "/v1/v10/x"},
		{"/v1", "/audio", "/v1/audio"},
		{"", "/v1/audio", "/v1/audio"},
	} {
		if got := passPath(c.base, c.path); got != c.want {
			t.Errorf("passPath(%q, %q): expected %q, got %q", c.base, c.path, c.want, got)
		}
	}
}

// A pass_through provider's error that echoes its key (whole, masked, in
// a gzip-encoded body, in plain text) reaches the client without it; its
// status and the rest of its body as they came. One the router cannot
// read is not passed on: a 502 says so.
func TestPassThroughRedactsTheKey(t *testing.T) {
	const key = "sk-proj-PassThrough0123456789wxyz"
	gz := func(s string) string {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		_, _ = w.Write([]byte(s))
		_ = w.Close()
		return b.String()
	}
	for _, tc := range []struct {
		name, encoding, body, want string
		status                     int
	}{
		{"whole key", "", `{"error":{"message":"Incorrect API key provided: ` + key + `","type":"invalid_request_error","code":"invalid_api_key"}}`,
			`{"error":{"message":"Incorrect API key provided: [redacted]","type":"invalid_request_error","code":"invalid_api_key"}}`, 401},
		{"masked, gzip-encoded", "gzip", gz(`{"error":{"message":"Incorrect API key provided: sk-proj-*********************wxyz."}}`),
			`{"error":{"message":"Incorrect API key provided: [redacted]."}}`, 401},
		{"plain text", "", "forbidden for key " + key + "\n", "forbidden for key [redacted]\n", 401},
		{"an encoding the router cannot read", "br", "\x0b\x02\x80" + key, `{"error":{"message":"pass_through: provider p answered an error in an encoding the router cannot read (br): not passed on, since it cannot be redacted",` +
			`"type":"server_error","param":null,"code":"upstream_unavailable"}}`, 502},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.encoding != "" {
					w.Header().Set("Content-Encoding", tc.encoding)
				}
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = io.WriteString(w, tc.body)
			}))
			defer upstream.Close()
			h := handlerFromJSON(t, `{"pass_through":"p","providers":{"p":{"type":"openai","base_url":"`+upstream.URL+`/v1","api_key":"`+key+`"}},
				"models":{"m":{"deployments":[{"provider":"p","model":"x"}]}}}`)
			if err := h.Provision(newCaddyContext(t)); err != nil {
				t.Fatal(err)
			}
			defer h.Cleanup()
			req := httptest.NewRequest(http.MethodPost, "/v1/audio/speech", strings.NewReader(`{"input":"hi"}`))
			req.Header.Set("Accept-Encoding", "gzip")
			rec := httptest.NewRecorder()
			h.passProxy.ServeHTTP(rec, req)
			got := rec.Body.String()
			if rec.Code != tc.status || strings.TrimSpace(got) != strings.TrimSpace(tc.want) || rec.Header().Get("Content-Encoding") != "" {
				t.Errorf("expected %d %s, got %d %q %v", tc.status, tc.want, rec.Code, got, rec.Header())
			}
		})
	}
}

// A pass_through provider's error body is read within the deadline and
// up to maxPassError decoded: one that trickles on past the deadline, or
// a gzip bomb, is passed on cut, redacted, without holding the client.
func TestPassThroughErrorBounds(t *testing.T) {
	const key = "sk-proj-PassThrough0123456789wxyz"
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	_, _ = zw.Write([]byte(`{"error":{"message":"key ` + key + ` `))
	_, _ = zw.Write(make([]byte, 1<<20))
	_ = zw.Close()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/bomb" {
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(bomb.Bytes())
			return
		}
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"key `+key+` `)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the rest never comes
	}))
	defer upstream.Close()
	h := handlerFromJSON(t, `{"pass_through":"p","deadline":"300ms","providers":{"p":{"type":"openai","base_url":"`+upstream.URL+`/v1","api_key":"`+key+`"}},
		"models":{"m":{"deployments":[{"provider":"p","model":"x"}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	for _, path := range []string{"/v1/trickle", "/v1/bomb"} {
		start := time.Now()
		rec := httptest.NewRecorder()
		h.passProxy.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`)))
		got := rec.Body.String()
		if took := time.Since(start); rec.Code != http.StatusBadRequest || !strings.HasPrefix(got, `{"error":{"message":"key [redacted] `) ||
			len(got) > maxPassError || strings.Contains(got, key) || took > 5*time.Second {
			t.Errorf("%s: expected the 400 cut and redacted within the deadline, got %d, %d bytes %.60q in %v", path, rec.Code, len(got), got, took)
		}
	}
}

// Accept-Encoding takes gzip unless it says q=0.
func TestAcceptsGzip(t *testing.T) {
	for v, want := range map[string]bool{"": false, "gzip": true, "br, gzip;q=0.5": true, "gzip;q=0": false, "gzip; q=0.000, br": false, "deflate, br": false, "X-GZIP": true} {
		if got := acceptsGzip(http.Header{"Accept-Encoding": {v}}); got != want {
			t.Errorf("%q: expected %v, got %v", v, want, got)
		}
	}
}
