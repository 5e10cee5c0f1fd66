package integration

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// pass_through through a real Caddy: a provider that echoes its key in an
// answer under 400 (a redirect's Location, a header, a 200 body) does not
// give it to the client, and a WebSocket upgrade gets its connection
// (it was a 502).
func TestPassThroughAnswersCarryNoKey(t *testing.T) {
	const key = "sk-proj-PassAnswer0123456789abcdef"
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Echo", "Bearer "+key)
		switch r.URL.Path {
		case "/v1/redirect":
			http.Redirect(w, r, "https://x.example/?key="+url.QueryEscape(key), http.StatusFound)
		case "/v1/realtime":
			conn, rw, _ := w.(http.Hijacker).Hijack()
			defer conn.Close()
			_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			_ = rw.Flush()
			line, _ := rw.ReadString('\n')
			_, _ = rw.WriteString("echo " + line)
			_ = rw.Flush()
		default:
			_, _ = io.WriteString(w, `{"data":[],"debug":"`+key+`"}`)
		}
	}))
	defer upstream.Close()
	load(t, `
http://localhost:9080 {
	llm_router /v1/* {
		pass_through oai
		provider oai {
			type openai
			base_url `+upstream.URL+`/v1
			api_key `+key+`
		}
		model m {
			deployment oai m-up
		}
	}
}
`)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"/v1/redirect", "/v1/files"} {
		resp, err := client.Get(routerURL + path)
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		var headers strings.Builder
		_ = resp.Header.Write(&headers)
		if all := headers.String() + body; strings.Contains(all, "PassAnswer0123") || !strings.Contains(all, "[redacted]") {
			t.Errorf("%s: expected the key redacted, got %d %s", path, resp.StatusCode, all)
		}
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(routerURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "GET /v1/realtime HTTP/1.1\r\nHost: localhost:9080\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nAuthorization: Bearer sk-router\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("expected 101 for the upgrade, got %v %v", resp, err)
	}
	_, _ = io.WriteString(conn, "ping\n")
	if got, _ := br.ReadString('\n'); got != "echo ping\n" {
		t.Errorf("expected the upgraded connection to carry the echo, got %q", got)
	}
}
