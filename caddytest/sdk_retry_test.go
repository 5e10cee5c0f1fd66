package integration

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// countingTransport counts the requests a client sends.
type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// The official OpenAI Go SDK, with its default retries (2 more on 408,
// 409, 429 and 5xx, sleeping any Retry-After up to a minute), asks the
// router once when the router gives up: its 502 (every provider failing)
// and its 429 (every provider limited past the deadline) say
// x-should-retry: false, with the Retry-After the router knows. Without
// it, a 1 s deadline became three requests and seconds of the SDK's
// sleeping.
func TestOpenAIGoSDKDoesNotRetryARouterGiveUp(t *testing.T) {
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
		})
	}
}
