package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"
	wresponses "github.com/llmrouter/caddy-llm-router/internal/wire/responses"
	prov "github.com/llmrouter/caddy-llm-router/provider"
)

// The official Go SDKs parse what the router builds itself when it
// translates: a server writes the client API's answers, streams and
// errors from an OpenAI-compatible server's (the conformance suite's
// fakes, internal/api/testdata/conformance: tool call ids such as
// "functions.get_weather:0", arguments that are not JSON), and the SDKs
// read them as a client would, their stream helpers included.

// fakeFile reads one of the conformance suite's provider fakes.
func fakeFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "internal", "api", "testdata", "conformance", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// chunksOf are the data of an OpenAI stream's events, [DONE] left out.
func chunksOf(sse []byte) [][]byte {
	var out [][]byte
	sc := bufio.NewScanner(bytes.NewReader(sse))
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && d != "[DONE]" {
			out = append(out, []byte(d))
		}
	}
	return out
}

// translatingServer answers POST /v1/messages and /v1/responses with the
// fake OpenAI answer or stream translated as the router translates it, and
// model "error" with the router's own error.
func translatingServer(t *testing.T) *httptest.Server {
	answer, stream := fakeFile(t, "openai-answer.json"), chunksOf(fakeFile(t, "openai-stream.sse"))
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		var a api.API = api.Messages{}
		if strings.HasSuffix(r.URL.Path, "/responses") {
			a = api.Responses{}
		}
		switch {
		case req.Model == "error":
			a.WriteError(w, api.ModelNotFoundError("error"))
		case !req.Stream:
			_ = a.Write(w, &router.Result{Status: 200, Format: prov.Chat, Body: answer})
		default:
			w.Header().Set("Content-Type", "text/event-stream")
			var chunk func([]byte) []byte
			var done func() []byte
			if _, ok := a.(api.Responses); ok {
				enc := wresponses.NewChatEncoder()
				chunk, done = enc.Chunk, enc.Done
			} else {
				enc := messages.NewChatEncoder()
				enc.PromptTokens = 15
				chunk, done = enc.Chunk, enc.Done
			}
			for _, c := range stream {
				_, _ = w.Write(chunk(c))
			}
			_, _ = w.Write(done())
		}
	}))
}

var toolUseID = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

func TestSDKMessagesParseTranslatedAnswers(t *testing.T) {
	srv := translatingServer(t)
	defer srv.Close()
	client := anthropic.NewClient(aoption.WithBaseURL(srv.URL+"/"), aoption.WithAPIKey("k"), aoption.WithMaxRetries(0))
	params := anthropic.MessageNewParams{Model: "m", MaxTokens: 100,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Weather and time in Paris?"))}}

	msg, err := client.Messages.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	checkMessage(t, "answer", msg)
	if !msg.JSON.StopSequence.Valid() && msg.JSON.StopSequence.Raw() != "null" {
		t.Errorf("answer: expected stop_sequence (null), got %q", msg.JSON.StopSequence.Raw())
	}
	for _, f := range []struct {
		name string
		raw  string
	}{{"cache_creation_input_tokens", msg.Usage.JSON.CacheCreationInputTokens.Raw()}, {"cache_read_input_tokens", msg.Usage.JSON.CacheReadInputTokens.Raw()},
		{"server_tool_use", msg.Usage.JSON.ServerToolUse.Raw()}, {"service_tier", msg.Usage.JSON.ServiceTier.Raw()}} {
		if f.raw == "" {
			t.Errorf("answer: expected usage.%s, got none", f.name)
		}
	}

	// The stream, accumulated by the SDK's helper as its clients do.
	stream := client.Messages.NewStreaming(context.Background(), params)
	var acc anthropic.Message
	var startInput int64
	for stream.Next() {
		ev := stream.Current()
		if ev.Type == "message_start" {
			startInput = ev.Message.Usage.InputTokens
		}
		if ev.Type == "message_delta" && ev.Delta.JSON.StopSequence.Raw() == "" {
			t.Errorf("stream: expected message_delta.delta.stop_sequence, got %s", ev.RawJSON())
		}
		if err := acc.Accumulate(ev); err != nil {
			t.Fatalf("the SDK's accumulator failed: %v", err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if startInput != 15 {
		t.Errorf("stream: expected message_start's input_tokens to be the estimate 15, got %d", startInput)
	}
	checkMessage(t, "stream", &acc)

	_, err = client.Messages.New(context.Background(), anthropic.MessageNewParams{Model: "error", MaxTokens: 1, Messages: params.Messages})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.HasPrefix(apiErr.RequestID, "req_") && !strings.Contains(apiErr.RawJSON(), `"request_id":"req_`) {
		t.Errorf("expected a 404 with a request_id, got %v", err)
	}
}

// checkMessage: every tool_use has an id of Anthropic's pattern and an
// input that is a JSON object; the id is a msg_ one.
func checkMessage(t *testing.T, what string, msg *anthropic.Message) {
	t.Helper()
	if !strings.HasPrefix(msg.ID, "msg_") {
		t.Errorf("%s: expected a msg_ id, got %q", what, msg.ID)
	}
	tools := 0
	for _, b := range msg.Content {
		if b.Type != "tool_use" {
			continue
		}
		tools++
		use := b.AsToolUse()
		var input map[string]any
		if !toolUseID.MatchString(use.ID) || json.Unmarshal(use.Input, &input) != nil {
			t.Errorf("%s: expected a tool_use id matching %s and an object input, got %q %s", what, toolUseID, use.ID, use.Input)
		}
	}
	if tools == 0 {
		t.Errorf("%s: expected tool_use blocks, got %+v", what, msg.Content)
	}
}

func TestSDKResponsesParseTranslatedAnswers(t *testing.T) {
	srv := translatingServer(t)
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	params := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Weather?")}}
	r, err := client.Responses.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	for name, raw := range map[string]string{"instructions": r.JSON.Instructions.Raw(), "temperature": r.JSON.Temperature.Raw(), "top_p": r.JSON.TopP.Raw()} {
		if raw == "" {
			t.Errorf("expected the response's %s, got none", name)
		}
	}
	if r.OutputText() != "Checking both." {
		t.Errorf("expected the output text, got %q", r.OutputText())
	}
	stream := client.Responses.NewStreaming(context.Background(), params)
	var names []string
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "response.function_call_arguments.done" {
			// openai-go v3.98.0 does not declare name (the spec requires it).
			var done struct {
				Name string `json:"name"`
			}
			_ = json.Unmarshal([]byte(ev.AsResponseFunctionCallArgumentsDone().RawJSON()), &done)
			names = append(names, done.Name)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "get_weather" {
		t.Errorf("expected function_call_arguments.done to name get_weather, got %q", names)
	}
}
