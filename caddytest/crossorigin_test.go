package integration

import (
	"encoding/json"
	"net/http"
	"strings"
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
