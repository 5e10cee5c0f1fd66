package integration

import (
	"context"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// The official OpenAI Go SDK's Responses client, pointed at the router,
// is served through the Chat Completions form of deployments that do not
// serve the Responses API, while the preferred one rate-limits: the
// answer, the stream's typed events and usage read as the SDK expects.
func TestOpenAIGoSDKResponsesTranslated(t *testing.T) {
	load(t, twoProviders("", "resp", "resp-a", "resp-b",
		"fault rate_limit {\n header Retry-After 30\n }",
		"chunks 4\n reply \"Hello from the fallback.\""))
	var last *http.Response
	client := openai.NewClient(option.WithBaseURL(routerURL+"/v1/"), option.WithAPIKey("client-key"),
		option.WithMaxRetries(0), option.WithResponseInto(&last))
	params := responses.ResponseNewParams{
		Model:        "resp",
		Instructions: openai.String("Be brief."),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello.")},
	}
	r, err := client.Responses.New(context.Background(), params)
	if err != nil {
		t.Fatalf("non-streaming: %v", err)
	}
	if r.OutputText() != "Hello from the fallback." || r.Status != responses.ResponseStatusCompleted {
		t.Errorf("expected the fallback's text, completed; got %q %q", r.OutputText(), r.Status)
	}
	if r.Usage.TotalTokens == 0 || r.Usage.InputTokens == 0 {
		t.Errorf("expected usage, got %+v", r.Usage)
	}
	if last == nil || last.Header.Get("X-LLM-Router-Deployment") != "b/resp-b" {
		t.Errorf("expected b/resp-b to answer, got %v", last.Header)
	}

	stream := client.Responses.NewStreaming(context.Background(), params)
	var types []string
	var text string
	var done responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			done = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("streaming: %v", err)
	}
	if text != "Hello from the fallback." || done.OutputText() != text || done.Usage.TotalTokens == 0 {
		t.Errorf("expected the text in deltas and in response.completed with usage, got %q / %q %+v", text, done.OutputText(), done.Usage)
	}
	if len(types) < 8 || types[0] != "response.created" || types[len(types)-1] != "response.completed" {
		t.Errorf("expected response.created ... response.completed, got %v", types)
	}
}
