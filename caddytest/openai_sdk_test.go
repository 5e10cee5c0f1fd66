package integration

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// The official OpenAI Go SDK, pointed at the router, is served while the
// preferred provider rate-limits: it never sees the 429.
func TestOpenAIGoSDK(t *testing.T) {
	load(t, twoProviders("", "sdk", "sdk-a", "sdk-b",
		"fault rate_limit {\n header Retry-After 30\n }",
		"chunks 4\n reply \"Hello from the fallback.\""))

	var last *http.Response
	client := openai.NewClient(
		option.WithBaseURL(routerURL+"/v1/"),
		option.WithAPIKey("client-key-never-forwarded"),
		option.WithMaxRetries(0), // a retry by the SDK would hide a 429 from this test
		option.WithResponseInto(&last),
	)
	params := openai.ChatCompletionNewParams{
		Model:    "sdk",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
	}

	completion, err := client.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatalf("non-streaming: %v", err)
	}
	if completion.Model != "sdk-b" || len(completion.Choices) != 1 ||
		completion.Choices[0].Message.Content != "Hello from the fallback." {
		t.Errorf("expected sdk-b's answer, got model %q choices %+v", completion.Model, completion.Choices)
	}
	if last == nil || last.Header.Get("X-LLM-Router-Deployment") != "b/sdk-b" || last.Header.Get("X-LLM-Router-Attempts") != "2" {
		t.Errorf("expected failover headers b/sdk-b after 2 attempts, got %v", last.Header)
	}
	if completion.Usage.TotalTokens == 0 {
		t.Error("expected usage passed on")
	}

	stream := client.Chat.Completions.NewStreaming(context.Background(), params)
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("streaming: %v", err)
	}
	if chunks < 4 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "Hello from the fallback." {
		t.Errorf("expected the streamed answer reassembled from %d chunks, got %+v", chunks, acc.Choices)
	}
	if !strings.HasPrefix(acc.Model, "sdk-b") {
		t.Errorf("expected chunks to name sdk-b, got %q", acc.Model)
	}
	if n := stats(t, 9081).Requests; n != 1 {
		t.Errorf("expected the rate-limited provider touched once, got %d", n)
	}
}

// A router error reaches the SDK as a typed *openai.Error.
func TestOpenAIGoSDKSeesRouterErrors(t *testing.T) {
	load(t, twoProviders("", "sdkerr", "sdkerr-a", "sdkerr-b", "", ""))
	client := openai.NewClient(option.WithBaseURL(routerURL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "no-such-group",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("expected a 404 model_not_found *openai.Error, got %v", err)
	}
}
