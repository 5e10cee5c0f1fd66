package integration

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// Every JSON endpoint answers a body that is not JSON by its Content-Type
// with a 415 in the client's format, before any routing: no attempt at
// any provider. The refused types are what a page on another origin can
// send without a CORS preflight (text/plain, multipart/form-data,
// application/x-www-form-urlencoded, which is also curl -d's, or none at
// all); each would otherwise spend the operator's account.
func TestNonJSONBodiesGet415(t *testing.T) {
	load(t, `
http://localhost:9080 {
	llm_router /v1/* {
		provider oai {
			type openai
			base_url http://localhost:9081/v1
			api_key sk-oai
		}
		provider claude {
			type anthropic
			base_url http://localhost:9082/v1
			api_key sk-ant
		}
		model gpt {
			deployment oai ct-gpt
		}
		model claude {
			deployment claude ct-claude
		}
	}
}
http://localhost:9081 {
	llm_mock
}
http://localhost:9082 {
	llm_mock {
		dialect anthropic
		api_key sk-ant
	}
}
`)
	endpoints := []struct {
		path, body string
		messages   bool // Anthropic's error format
	}{
		{"/v1/chat/completions", `{"model":"gpt","messages":[{"role":"user","content":"hi"}]}`, false},
		{"/v1/completions", `{"model":"gpt","prompt":"hi"}`, false},
		{"/v1/embeddings", `{"model":"gpt","input":"hi"}`, false},
		{"/v1/responses", `{"model":"gpt","input":"hi"}`, false},
		{"/v1/messages", `{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, true},
		{"/v1/messages/count_tokens", `{"model":"claude","messages":[{"role":"user","content":"hi"}]}`, true},
	}
	for _, ep := range endpoints {
		for _, ct := range []string{"text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""} {
			req, _ := http.NewRequest(http.MethodPost, routerURL+ep.path, strings.NewReader(ep.body))
			if ct != "" {
				req.Header.Set("Content-Type", ct)
			}
			if ep.messages {
				req.Header.Set("Anthropic-Version", "2023-06-01")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			var e struct {
				Type  string
				Error struct{ Type, Code, Message string }
			}
			_ = json.Unmarshal([]byte(body), &e)
			inFormat := e.Error.Type == "invalid_request_error" && e.Error.Code == "unsupported_content_type"
			if ep.messages {
				inFormat = e.Type == "error" && e.Error.Type == "invalid_request_error"
			}
			sent := "no Content-Type"
			if ct != "" {
				sent = `Content-Type "` + ct + `"`
			}
			if resp.StatusCode != 415 || !inFormat || !strings.Contains(e.Error.Message, sent) ||
				!strings.Contains(e.Error.Message, "application/json") || resp.Header.Get("X-Should-Retry") != "false" {
				t.Errorf("%s with %s: expected a 415 in the client's format naming it and application/json, got %d %s",
					ep.path, sent, resp.StatusCode, body)
			}
		}
	}
	if s := stats(t, 9081); s.Requests != 0 {
		t.Errorf("expected no request at the OpenAI provider, got %d", s.Requests)
	}
	if s := stats(t, 9082); s.Requests != 0 || s.CountTokens != 0 {
		t.Errorf("expected no request at the Anthropic provider, got %d and %d count_tokens", s.Requests, s.CountTokens)
	}
	// The same requests as JSON reach the providers (the counts count).
	for _, ep := range endpoints {
		req, _ := http.NewRequest(http.MethodPost, routerURL+ep.path, strings.NewReader(ep.body))
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); resp.StatusCode != 200 {
			t.Errorf("%s as JSON: expected 200, got %d %s", ep.path, resp.StatusCode, body)
		}
	}
	if a, b := stats(t, 9081), stats(t, 9082); a.Requests != 4 || b.Requests != 1 || b.CountTokens != 1 {
		t.Errorf("expected 4 requests at the OpenAI provider, 1 and 1 count_tokens at the Anthropic one, got %d, %d and %d",
			a.Requests, b.Requests, b.CountTokens)
	}
}

// pass_through through a real Caddy: a form's cross-site upload and a
// cross-site preflight never reach the provider (a 403 in OpenAI's
// format); the same upload with an SDK's Bearer key, which a browser
// sends only after a preflight the Caddyfile allowed, and an SDK's own
// (no Origin) pass.
func TestPassThroughRefusesCrossOriginFormUploads(t *testing.T) {
	var attempts atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		w.Header().Set("Access-Control-Allow-Origin", "*")
		_, _ = w.Write([]byte(`{"id":"file-1","object":"file"}`))
	}))
	defer upstream.Close()
	load(t, `
http://localhost:9080 {
	llm_router /v1/* {
		pass_through oai
		provider oai {
			type openai
			base_url `+upstream.URL+`/v1
			api_key sk-pass-through
		}
		model m {
			deployment oai m-up
		}
	}
}
`)
	const form = "--x\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--x--\r\n"
	for _, c := range []struct {
		name, method string
		header       map[string]string
		status       int
		reached      int64
	}{
		{"a cross-site form upload", http.MethodPost,
			map[string]string{"Content-Type": "multipart/form-data; boundary=x", "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, 403, 0},
		{"a cross-site preflight", http.MethodOptions,
			map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site", "Access-Control-Request-Method": "POST"}, 403, 0},
		{"a preflighted upload with a Bearer key", http.MethodPost, map[string]string{"Content-Type": "multipart/form-data; boundary=x",
			"Authorization": "Bearer sk-router", "Origin": "https://app.example", "Sec-Fetch-Site": "cross-site"}, 200, 1},
		{"an SDK's upload", http.MethodPost, map[string]string{"Content-Type": "multipart/form-data; boundary=x", "Authorization": "Bearer sk-router"}, 200, 1},
	} {
		before := attempts.Load()
		req, _ := http.NewRequest(c.method, routerURL+"/v1/files", strings.NewReader(form))
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		if n := attempts.Load() - before; resp.StatusCode != c.status || n != c.reached ||
			c.status == 403 && (!strings.Contains(body, `"code":"cross_origin_request"`) || resp.Header.Get("Access-Control-Allow-Origin") != "") {
			t.Errorf("%s: expected %d after %d attempts at the provider, got %d after %d: %v %s", c.name, c.status, c.reached, resp.StatusCode, n, resp.Header, body)
		}
	}
}
