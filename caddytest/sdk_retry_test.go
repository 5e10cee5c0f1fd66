package integration

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// countingTransport counts the requests a client sends.
type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// The official OpenAI and Anthropic Go SDKs, with their default retries
// (2 more on 408, 409, 429 and 5xx, sleeping any Retry-After up to a
// minute), ask the router once when the router gives up: its 502 (every
// provider failing) and its 429 (every provider limited past the deadline)
// say x-should-retry: false, with the Retry-After the router knows.
// Without it, a 1 s deadline became three requests and 2 s (502) or 6 s
// (429, Retry-After 3) of the SDK's sleeping.
func TestOfficialSDKsDoNotRetryARouterGiveUp(t *testing.T) {
	for _, tc := range []struct {
		name, group, fault string
		status             int
	}{
		{"every provider failing", "giveup502", "fault status {\n status 503\n }", http.StatusBadGateway},
		{"every provider limited past the deadline", "giveup429", "fault rate_limit {\n header Retry-After 3\n }", http.StatusTooManyRequests},
	} {
		t.Run(tc.group, func(t *testing.T) {
			load(t, twoProviders("deadline 1s", tc.group, tc.group+"-a", tc.group+"-b", tc.fault, tc.fault))
			counter := &countingTransport{}
			var last *http.Response
			client := openai.NewClient(option.WithBaseURL(routerURL+"/v1/"), option.WithAPIKey("client-key"),
				option.WithHTTPClient(&http.Client{Transport: counter}), option.WithResponseInto(&last)) // the SDK's default retries
			began := time.Now()
			_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model:    tc.group,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			})
			took := time.Since(began)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != tc.status {
				t.Fatalf("%s: expected a %d *openai.Error, got %v", tc.name, tc.status, err)
			}
			if n := counter.n.Load(); n != 1 || took > 2*time.Second {
				t.Errorf("%s: expected the SDK to ask the router once, within the 1 s deadline; it asked %d times in %s", tc.name, n, took)
			}
			if last == nil || last.Header.Get("X-Should-Retry") != "false" {
				t.Errorf("%s: expected x-should-retry: false, got %v", tc.name, last)
			}

			// The Anthropic Go SDK alike, on the Messages endpoint.
			counter = &countingTransport{}
			ac := anthropic.NewClient(aoption.WithBaseURL(routerURL+"/"), aoption.WithAPIKey("client-key"),
				aoption.WithHTTPClient(&http.Client{Transport: counter}))
			began = time.Now()
			_, err = ac.Messages.New(context.Background(), anthropic.MessageNewParams{Model: tc.group, MaxTokens: 10,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
			var aErr *anthropic.Error
			if !errors.As(err, &aErr) || aErr.StatusCode != tc.status {
				t.Fatalf("%s, Anthropic SDK: expected a %d *anthropic.Error, got %v", tc.name, tc.status, err)
			}
			if n := counter.n.Load(); n != 1 || time.Since(began) > 2*time.Second {
				t.Errorf("%s, Anthropic SDK: expected one request within the deadline, got %d in %s", tc.name, n, time.Since(began))
			}
		})
	}
}

// pass_through makes one attempt and no failover: when its provider cannot
// be reached, the client's own retry is the only one, and the 502 leaves
// it alone (no x-should-retry).
func TestPassThroughUnreachableLeavesRetriesToTheClient(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String() // nothing listens there once closed
	l.Close()
	load(t, `
http://localhost:9080 {
	llm_router /v1/* {
		pass_through gone
		provider gone {
			type openai
			base_url http://`+closed+`/v1
			api_key sk-pass-through
		}
		model passgone {
			deployment gone passgone-up
		}
	}
}
`)
	resp, err := http.Post(routerURL+"/v1/audio/speech", "application/json", strings.NewReader(`{"input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, set := resp.Header["X-Should-Retry"]; resp.StatusCode != http.StatusBadGateway || set {
		t.Errorf("expected 502 without x-should-retry, got %d %v", resp.StatusCode, resp.Header)
	}
}
