package llmrouter

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A pass_through answer under 400 (a provider's, or a hostile one's)
// does not give the client the provider's key either: not in its headers
// (a redirect's Location, an echo), not in its body (plain, split across
// two writes, URL-encoded, gzip-encoded), and the body keeps its length
// (Content-Length, a download's Range) when it comes unencoded.
func TestPassThroughRedactsAnswers(t *testing.T) {
	const key = "sk-proj-PassThrough0123456789wxyz+/="
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Echo-Key", "Bearer "+key)
		switch r.URL.Path {
		case "/v1/redirect":
			w.Header().Set("Location", "https://login.example/?key="+url.QueryEscape(key))
			w.WriteHeader(http.StatusFound)
		case "/v1/split":
			_, _ = io.WriteString(w, `{"id":"file-1","note":"`+key[:11])
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
			_, _ = io.WriteString(w, key[11:]+` and `+url.QueryEscape(key)+`"}`)
		case "/v1/gzip":
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, `{"note":"`+key+`"}`)
			_ = zw.Close()
		default:
			body := `{"note":"` + key + `","x":"ab"}`
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			_, _ = io.WriteString(w, body)
		}
	}))
	defer upstream.Close()
	h := handlerFromJSON(t, `{"pass_through":"p","providers":{"p":{"type":"openai","base_url":"`+upstream.URL+`/v1","api_key":"`+key+`"}},
		"models":{"m":{"deployments":[{"provider":"p","model":"x"}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	for _, path := range []string{"/v1/redirect", "/v1/split", "/v1/gzip", "/v1/files/file-1/content"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Accept-Encoding", "gzip")
		rec := httptest.NewRecorder()
		h.passProxy.ServeHTTP(rec, req)
		var headers bytes.Buffer
		_ = rec.Header().Write(&headers)
		got := headers.String() + rec.Body.String()
		if rec.Code >= 400 || strings.Contains(got, "PassThrough0123") || strings.Contains(got, url.QueryEscape(key)[10:]) || rec.Header().Get("Content-Encoding") != "" {
			t.Errorf("%s: expected the key redacted, got %d %s", path, rec.Code, got)
		}
		if cl := rec.Header().Get("Content-Length"); path == "/v1/files/file-1/content" && cl != strconv.Itoa(len(key)+20) {
			t.Errorf("%s: expected the length kept, got Content-Length %s", path, cl)
		}
	}
}

// A pass_through stream's events reach the client as they come: what
// may be the start of a key is held, no more.
func TestPassThroughAnswerFlowsAsItComes(t *testing.T) {
	const key = "sk-proj-PassThrough0123456789wxyz"
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"delta\":\"hi sk-proj-\"}\n\n")
		w.(http.Flusher).Flush()
		<-release
	}))
	defer upstream.Close()
	defer close(release)
	h := handlerFromJSON(t, `{"pass_through":"p","providers":{"p":{"type":"openai","base_url":"`+upstream.URL+`/v1","api_key":"`+key+`"}},
		"models":{"m":{"deployments":[{"provider":"p","model":"x"}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	router := httptest.NewServer(h.passProxy)
	defer router.Close()
	resp, err := http.Get(router.URL + "/v1/audio/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(resp.Body).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if l != "data: {\"delta\":\"hi sk-proj-\"}\n" {
			t.Errorf("expected the event as sent, got %q", l)
		}
	case <-time.After(3 * time.Second):
		t.Error("the event was held until the stream's end")
	}
}

// A pass_through upgrade (a WebSocket) still gets its connection: the
// answer's redaction leaves a 101's body, the connection, alone.
func TestPassThroughUpgradeKeepsItsConnection(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = rw.Flush()
		line, _ := rw.ReadString('\n')
		_, _ = rw.WriteString("echo " + line)
		_ = rw.Flush()
	}))
	defer upstream.Close()
	h := handlerFromJSON(t, `{"pass_through":"p","providers":{"p":{"type":"openai","base_url":"`+upstream.URL+`/v1","api_key":"sk-proj-PassThrough0123456789wxyz"}},
		"models":{"m":{"deployments":[{"provider":"p","model":"x"}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	router := httptest.NewServer(h.passProxy)
	defer router.Close()
	conn, err := net.Dial("tcp", router.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(conn, "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("expected 101, got %v %v", resp, err)
	}
	_, _ = io.WriteString(conn, "ping\n")
	if got, _ := br.ReadString('\n'); got != "echo ping\n" {
		t.Errorf("expected the upgraded connection to carry the echo, got %q", got)
	}
}
