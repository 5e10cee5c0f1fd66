package integration

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
)

// TestContextWindowPreCheck: a prompt larger than every deployment's
// context_window gets a 400 context_length_exceeded in the client's format
// at once; no provider is asked.
func TestContextWindowPreCheck(t *testing.T) {
	load(t, `
http://localhost:9080 {
	llm_router /v1/* {
		provider a {
			type openai
			base_url http://localhost:9081/v1
			api_key sk-provider-a
		}
		model small {
			deployment a gpt-4o-mini {
				context_window 200
			}
		}
		model vision {
			deployment a claude-vision {
				context_window 128000
			}
		}
	}
}
http://localhost:9081 {
	llm_mock
}
`)
	long := strings.Repeat("All work and no play makes Jack a dull boy. ", 40) // about 440 tokens by bytes / 4
	req, _ := http.NewRequest(http.MethodPost, routerURL+"/v1/chat/completions",
		strings.NewReader(`{"model":"small","messages":[{"role":"user","content":"`+long+`"}]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 400 || !strings.Contains(body, `"code":"context_length_exceeded"`) || !strings.Contains(body, "largest: 200 tokens") {
		t.Errorf("expected a 400 context_length_exceeded, got %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Llm-Router-Attempts") != "0" {
		t.Errorf("expected no attempt, got %q", resp.Header.Get("X-Llm-Router-Attempts"))
	}
	if n := stats(t, 9081).Requests; n != 0 {
		t.Errorf("expected the provider never asked, got %d requests", n)
	}
	// A request that fits is served.
	if resp := chat(t, "small", false); resp.StatusCode != 200 {
		t.Errorf("a short request: expected 200, got %d %s", resp.StatusCode, readBody(t, resp))
	} else {
		resp.Body.Close()
	}
	// An inline image counts as an image, not as its bytes: a screenshot of
	// 1 MB of base64 (330,000 tokens by bytes / 4) goes to a 128k window.
	img := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("\x89PNG\r\n\x1a\n"), 100_000))
	vision := `{"model":"vision","messages":[{"role":"user","content":[{"type":"text","text":"What is in this picture?"},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + img + `"}}]}]}`
	resp, err = http.Post(routerURL+"/v1/chat/completions", "application/json", strings.NewReader(vision))
	if err != nil {
		t.Fatal(err)
	}
	if got := readBody(t, resp); resp.StatusCode != 200 || resp.Header.Get("X-Llm-Router-Attempts") != "1" {
		t.Errorf("expected the image request served, got %d %.300s", resp.StatusCode, got)
	}
}
