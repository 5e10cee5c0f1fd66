package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

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

// nativeResponses is a group of two deployments on mocks that serve the
// Responses API natively (responses native); a is preferred, and answers
// 503 during its first second.
func nativeResponses(group, modelA, modelB string) string {
	return fmt.Sprintf(`
http://localhost:9080 {
	llm_router /v1/* {
		provider a {
			type openai
			base_url http://localhost:9081/v1
			api_key sk-provider-a
			responses native
		}
		provider b {
			type openai
			base_url http://localhost:9082/v1
			api_key sk-provider-b
			responses native
		}
		model %s {
			deployment a %s {
				quality 0.9
			}
			deployment b %s {
				quality 0.5
			}
		}
	}
}
http://localhost:9081 {
	llm_mock {
		reply "Hello from a."
		fault status {
			status 503
			for 1s
		}
	}
}
http://localhost:9082 {
	llm_mock {
		chunks 3
		reply "Hello from b."
	}
}
`, group, modelA, modelB)
}

// Deployments that serve the Responses API get the request as the client
// wrote it, and their answers and events pass through; a request with
// previous_response_id goes to the deployment that made that response
// (its provider alone keeps the state), even when another ranks first.
func TestOpenAIGoSDKResponsesNativeAndContinued(t *testing.T) {
	load(t, nativeResponses("native", "native-a", "native-b"))
	var last *http.Response
	client := openai.NewClient(option.WithBaseURL(routerURL+"/v1/"), option.WithAPIKey("client-key"),
		option.WithMaxRetries(0), option.WithResponseInto(&last))
	first, err := client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "native",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello.")},
	})
	if err != nil {
		t.Fatalf("first: %v", err)
	}
	if first.OutputText() != "Hello from b." || !strings.HasPrefix(first.ID, "resp_mock") ||
		last.Header.Get("X-LLM-Router-Deployment") != "b/native-b" {
		t.Fatalf("expected b's own response while a fails, got %q %q from %q", first.ID, first.OutputText(), last.Header.Get("X-LLM-Router-Deployment"))
	}
	if got := stats(t, 9082).Requests; got != 1 {
		t.Errorf("expected b asked once, got %d", got)
	}
	// A request adding to a conversation (the Conversations API's) is
	// served by b while a fails: the conversation is b's from then on.
	conv := func() string {
		t.Helper()
		resp, err := http.Post(routerURL+"/v1/responses", "application/json",
			strings.NewReader(`{"model":"native","conversation":{"id":"conv_abc"},"input":"More."}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("conversation: expected 200, got %d", resp.StatusCode)
		}
		return resp.Header.Get("X-LLM-Router-Deployment")
	}
	if d := conv(); d != "b/native-b" {
		t.Fatalf("expected b to serve the conversation while a fails, got %q", d)
	}

	// a is back and ranks first for a new conversation...
	deadline := time.Now().Add(10 * time.Second)
	for {
		fresh, err := client.Responses.New(context.Background(), responses.ResponseNewParams{
			Model: "native", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Again.")}})
		if err == nil && fresh.OutputText() == "Hello from a." {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected a back within 10 s, last %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// ...but the conversation stays with b...
	if d := conv(); d != "b/native-b" {
		t.Errorf("expected the conversation kept on b, got %q", d)
	}
	// ...and the continuation of b's response goes to b, streamed.
	stream := client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{
		Model:              "native",
		PreviousResponseID: openai.String(first.ID),
		Input:              responses.ResponseNewParamsInputUnion{OfString: openai.String("And again.")},
	})
	var text string
	var completed responses.Response
	for stream.Next() {
		switch ev := stream.Current(); ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			completed = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("continued stream: %v", err)
	}
	if text != "Hello from b." || completed.OutputText() != text || !strings.HasPrefix(completed.ID, "resp_mock") {
		t.Errorf("expected b's streamed answer, got %q (completed %q %q)", text, completed.ID, completed.OutputText())
	}

	// A continuation of a response the router translated has no state anywhere.
	load(t, twoProviders("", "trans", "trans-a", "trans-b", "", ""))
	tr, err := client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "trans", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Hi.")}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "trans", PreviousResponseID: openai.String(tr.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Hi again.")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "previous_response_id" ||
		!strings.Contains(apiErr.Message, "send the whole conversation as input") {
		t.Errorf("expected a 400 on previous_response_id saying why, got %v", err)
	}
}

// A function-calling round trip with the SDK, translated: the model's call
// comes back as a function_call item; the SDK sends the call and its output
// back as input items, and the answer follows.
func TestOpenAIGoSDKResponsesFunctionCall(t *testing.T) {
	load(t, twoProviders("", "fcall", "fcall-a", "fcall-b",
		"tool_call get_weather `{\"city\":\"Paris\"}`\n reply \"It is sunny in Paris.\"", ""))
	client := openai.NewClient(option.WithBaseURL(routerURL+"/v1/"), option.WithAPIKey("client-key"), option.WithMaxRetries(0))
	tools := []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather",
		map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}, false)}
	input := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("Weather in Paris?", responses.EasyInputMessageRoleUser)}
	first, err := client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "fcall", Tools: tools, Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Output) != 1 || first.Output[0].Type != "function_call" {
		t.Fatalf("expected one function_call item, got %+v", first.Output)
	}
	call := first.Output[0].AsFunctionCall()
	if call.Name != "get_weather" || call.Arguments != `{"city":"Paris"}` || call.CallID == "" {
		t.Fatalf("expected get_weather(Paris) with a call id, got %+v", call)
	}
	if s := stats(t, 9081); !strings.Contains(s.LastBody, `"name":"get_weather"`) {
		t.Errorf("expected the tool sent upstream as a function tool, got %s", s.LastBody)
	}
	callParam := call.ToParam()
	input = append(input, responses.ResponseInputItemUnionParam{OfFunctionCall: &callParam},
		responses.ResponseInputItemUnionParam{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{
			CallID: openai.String(call.CallID),
			Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String(`{"sky":"sunny"}`)}}})
	stream := client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{
		Model: "fcall", Tools: tools, Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}})
	var done responses.Response
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "response.completed" {
			done = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if done.OutputText() != "It is sunny in Paris." {
		t.Errorf("expected the answer after the tool's output, got %q", done.OutputText())
	}
	s := stats(t, 9081)
	if !strings.Contains(s.LastBody, `"role":"tool"`) || !strings.Contains(s.LastBody, `"tool_call_id":"`+call.CallID+`"`) ||
		!strings.Contains(s.LastBody, `sunny`) {
		t.Errorf("expected the call and its output upstream as Chat tool messages, got %s", s.LastBody)
	}
}
