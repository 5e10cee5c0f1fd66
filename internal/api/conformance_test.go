package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// The conformance suite: what the router builds itself (an answer, a
// stream's events, an error, in a translated direction) is validated
// against the providers' OpenAPI specifications (testdata/openapi: which
// versions, and from where). The providers' answers are fakes written from
// their documentation (testdata/conformance), with the faults the router
// must absorb: tool call ids that break Anthropic's pattern, arguments
// that are not JSON.

var specs struct {
	once              sync.Once
	openai, anthropic *openapi3.T
	err               error
}

// spec returns the loaded specification of name ("openai", "anthropic").
func spec(t *testing.T, name string) *openapi3.T {
	t.Helper()
	specs.once.Do(func() {
		if specs.openai, specs.err = loadSpec("openai", ""); specs.err == nil {
			specs.anthropic, specs.err = loadSpec("anthropic", "anthropic-overlay.json")
		}
	})
	if specs.err != nil {
		t.Fatal(specs.err)
	}
	if name == "openai" {
		return specs.openai
	}
	return specs.anthropic
}

// loadSpec loads testdata/openapi/<name>.json with overlay's schema
// changes merged in (required lists joined, properties replaced).
func loadSpec(name, overlay string) (*openapi3.T, error) {
	raw, err := os.ReadFile(filepath.Join("testdata", "openapi", name+".json"))
	if err != nil {
		return nil, err
	}
	if overlay != "" {
		if raw, err = applyOverlay(raw, filepath.Join("testdata", "openapi", overlay)); err != nil {
			return nil, err
		}
	}
	loader := openapi3.NewLoader()
	return loader.LoadFromData(raw)
}

func applyOverlay(raw []byte, path string) ([]byte, error) {
	var doc struct {
		Components struct {
			Schemas map[string]map[string]any `json:"schemas"`
		} `json:"components"`
		Rest map[string]any `json:"-"`
	}
	var whole map[string]any
	if err := json.Unmarshal(raw, &whole); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	ovRaw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ov struct {
		Schemas map[string]struct {
			Required   []any          `json:"required"`
			Properties map[string]any `json:"properties"`
		} `json:"schemas"`
	}
	if err := json.Unmarshal(ovRaw, &ov); err != nil {
		return nil, err
	}
	for name, patch := range ov.Schemas {
		s := doc.Components.Schemas[name]
		if s == nil {
			s = map[string]any{"type": "object"}
			doc.Components.Schemas[name] = s
		}
		req, _ := s["required"].([]any)
		s["required"] = append(req, patch.Required...)
		props, _ := s["properties"].(map[string]any)
		if props == nil {
			props = map[string]any{}
		}
		for k, v := range patch.Properties {
			props[k] = v
		}
		s["properties"] = props
	}
	whole["components"] = map[string]any{"schemas": doc.Components.Schemas}
	return json.Marshal(whole)
}

// validate checks body against the spec's schema, failing t with what
// does not fit.
func validate(t *testing.T, specName, schema string, body []byte) {
	t.Helper()
	ref := spec(t, specName).Components.Schemas[schema]
	if ref == nil || ref.Value == nil {
		t.Fatalf("no schema %s in %s", schema, specName)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Errorf("%s: invalid JSON %s: %v", schema, body, err)
		return
	}
	if err := ref.Value.VisitJSON(v, openapi3.EnableJSONSchema2020(), openapi3.MultiErrors()); err != nil {
		t.Errorf("%s %s: %s does not fit the spec: %v", specName, schema, body, err)
	}
}

// fake reads a provider fake from testdata/conformance.
func fake(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "conformance", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// plan plans a Chat request on p, streamed or not.
func plan(t *testing.T, p provider.Provider, stream bool) provider.Plan {
	t.Helper()
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"What is the weather in Paris?"}],"tools":[{"type":"function",` +
		`"function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}`)
	pl, err := p.Plan(context.Background(), "m", &provider.Request{Format: provider.Chat, Body: body, Stream: stream, Choices: 1, IncludeUsage: stream})
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// chatAnswer is the Chat answer p's plan makes of the provider's body.
func chatAnswer(t *testing.T, p provider.Provider, body []byte) []byte {
	t.Helper()
	out, err := plan(t, p, false).Answer(body)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// chatChunks are the chunks p's plan relays of the provider's stream.
func chatChunks(t *testing.T, p provider.Provider, sse []byte) [][]byte {
	t.Helper()
	s := plan(t, p, true).Stream(bytes.NewReader(sse))
	var out [][]byte
	for {
		ev, kind, _, err := s.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if (kind == provider.EventData || kind == provider.EventFinal) && len(ev.Data) > 0 {
			out = append(out, bytes.Clone(ev.Data))
		}
	}
}

// events splits server-sent events into (name, data) pairs.
func events(t *testing.T, stream []byte) [][2]string {
	t.Helper()
	var out [][2]string
	for _, frame := range strings.Split(string(stream), "\n\n") {
		var name, data string
		for _, line := range strings.Split(frame, "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				name = v
			} else if v, ok := strings.CutPrefix(line, "data: "); ok {
				data += v
			}
		}
		if data != "" {
			out = append(out, [2]string{name, data})
		}
	}
	return out
}

// writeStream writes chunks through w as a stream that ends whole, or
// failed when fail is set.
func writeStream(t *testing.T, w streamWriter, chunks [][]byte, fail *router.StreamError) []byte {
	t.Helper()
	var buf bytes.Buffer
	for _, c := range chunks {
		if err := w.event(&buf, provider.Event{Data: c}); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if fail != nil {
		err = w.failed(&buf, fail)
	} else {
		err = w.done(&buf)
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

var messagesEvents = map[string]string{
	"message_start": "MessageStartEvent", "content_block_start": "ContentBlockStartEvent",
	"content_block_delta": "ContentBlockDeltaEvent", "content_block_stop": "ContentBlockStopEvent",
	"message_delta": "MessageDeltaEvent", "message_stop": "MessageStopEvent", "error": "ErrorResponse",
}

// responsesEvents are the OpenAI schemas of the Responses stream events
// the router writes.
var responsesEvents = map[string]string{
	"response.created": "ResponseCreatedEvent", "response.in_progress": "ResponseInProgressEvent",
	"response.output_item.added": "ResponseOutputItemAddedEvent", "response.output_item.done": "ResponseOutputItemDoneEvent",
	"response.content_part.added": "ResponseContentPartAddedEvent", "response.content_part.done": "ResponseContentPartDoneEvent",
	"response.output_text.delta": "ResponseTextDeltaEvent", "response.output_text.done": "ResponseTextDoneEvent",
	"response.refusal.delta": "ResponseRefusalDeltaEvent", "response.refusal.done": "ResponseRefusalDoneEvent",
	"response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
	"response.function_call_arguments.done":  "ResponseFunctionCallArgumentsDoneEvent",
	"response.completed":                     "ResponseCompletedEvent", "response.incomplete": "ResponseIncompleteEvent",
	"response.failed": "ResponseFailedEvent",
}

// validateEvents checks each event's data against its schema (by the
// data's type), and that the event: line names it so.
func validateEvents(t *testing.T, specName string, schemas map[string]string, stream []byte) []string {
	t.Helper()
	var types []string
	for _, ev := range events(t, stream) {
		var head struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal([]byte(ev[1]), &head)
		schema, ok := schemas[head.Type]
		if !ok {
			t.Errorf("an event of unknown type %q: %s", head.Type, ev[1])
			continue
		}
		if ev[0] != head.Type {
			t.Errorf("event: %q names a %s", ev[0], head.Type)
		}
		types = append(types, head.Type)
		validate(t, specName, schema, []byte(ev[1]))
	}
	return types
}

// translatedChat are the providers whose answers a Chat client gets
// translated.
var translatedChat = []struct {
	name   string
	p      provider.Provider
	answer string
	stream string
}{
	{"anthropic", &adapters.Anthropic{Endpoint: provider.Endpoint{BaseURL: "https://anthropic.invalid/v1"}}, "anthropic-answer.json", "anthropic-stream.sse"},
	{"gemini", &adapters.Gemini{Endpoint: provider.Endpoint{BaseURL: "https://gemini.invalid/v1beta"}}, "gemini-answer.json", "gemini-stream.sse"},
}

// A Chat client's answers, chunks and errors from Anthropic and Gemini
// deployments fit OpenAI's spec.
func TestConformanceChatClient(t *testing.T) {
	for _, tc := range translatedChat {
		t.Run(tc.name, func(t *testing.T) {
			answer := chatAnswer(t, tc.p, fake(t, tc.answer))
			validate(t, "openai", "CreateChatCompletionResponse", answer)
			for _, c := range chatChunks(t, tc.p, fake(t, tc.stream)) {
				validate(t, "openai", "CreateChatCompletionStreamResponse", c)
			}
		})
	}
	for _, e := range conformanceErrors {
		w := httptest.NewRecorder()
		Chat{}.WriteError(w, e)
		validate(t, "openai", "ErrorResponse", w.Body.Bytes())
	}
	out := writeStream(t, Chat{}.newStream(provider.Chat), nil, &router.StreamError{Class: provider.Overloaded, Message: "overloaded"})
	for _, ev := range events(t, out) {
		validate(t, "openai", "ErrorResponse", []byte(ev[1]))
	}
}

// conformanceErrors are the router's own errors, one of each kind.
var conformanceErrors = []*Error{
	Errorf(http.StatusBadRequest, InvalidJSON, "", "not JSON"),
	Errorf(http.StatusBadRequest, MissingParameter, "messages", "messages is required"),
	ModelNotFoundError("nope"),
	MethodError,
	Errorf(http.StatusRequestEntityTooLarge, BodyTooLarge, "", "too large"),
	Errorf(http.StatusUnsupportedMediaType, UnsupportedMedia, "", "not JSON"),
	fromRouter(&router.Error{Status: 429, Class: provider.RateLimited, Message: "every deployment is rate-limited"}),
	fromRouter(&router.Error{Status: 502, Class: provider.Server, Message: "every deployment failed"}),
	fromRouter(&router.Error{Status: 504, Class: provider.Transport, Message: "deadline"}),
	fromRouter(&router.Error{Status: 400, Class: provider.ClientError, Message: "cannot express"}),
	fromRouter(&router.Error{Status: 400, Class: provider.ContextLength, Message: "too long"}),
	Errorf(http.StatusBadGateway, Untranslatable, "", "the answer could not be translated"),
}

// A Messages client's answers, streams and errors from an OpenAI-format
// deployment fit Anthropic's spec.
func TestConformanceMessagesClient(t *testing.T) {
	openai := &adapters.OpenAI{Endpoint: provider.Endpoint{BaseURL: "https://openai.invalid/v1"}}
	for _, tc := range append(translatedChat, struct {
		name   string
		p      provider.Provider
		answer string
		stream string
	}{"openai", openai, "openai-answer.json", "openai-stream.sse"}) {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			if err := (Messages{}).Write(w, &router.Result{Status: 200, Format: provider.Chat, Body: chatAnswer(t, tc.p, fake(t, tc.answer))}); err != nil {
				t.Fatal(err)
			}
			if w.Code != 200 {
				t.Fatalf("expected 200, got %d %s", w.Code, w.Body)
			}
			validate(t, "anthropic", "Message", w.Body.Bytes())

			out := writeStream(t, Messages{prompt: 15}.newStream(provider.Chat), chatChunks(t, tc.p, fake(t, tc.stream)), nil)
			types := validateEvents(t, "anthropic", messagesEvents, out)
			if len(types) < 3 || types[0] != "message_start" || types[len(types)-1] != "message_stop" {
				t.Errorf("expected message_start ... message_stop, got %v", types)
			}
			failed := writeStream(t, Messages{}.newStream(provider.Chat), chatChunks(t, tc.p, fake(t, tc.stream))[:1],
				&router.StreamError{Class: provider.Overloaded, Message: "overloaded"})
			if types := validateEvents(t, "anthropic", messagesEvents, failed); !slices.Contains(types, "error") {
				t.Errorf("expected an error event, got %v", types)
			}
		})
	}
	for _, e := range conformanceErrors {
		w := httptest.NewRecorder()
		Messages{}.WriteError(w, e)
		validate(t, "anthropic", "ErrorResponse", w.Body.Bytes())
	}
	w := httptest.NewRecorder()
	_ = Messages{}.Write(w, &router.Result{Status: 429, Format: provider.Chat,
		Error: &provider.Observation{Class: provider.RateLimited, Message: "slow down"}})
	validate(t, "anthropic", "ErrorResponse", w.Body.Bytes())
}

// A Responses client's answers, streams and errors from Chat-format
// deployments (OpenAI-compatible, Anthropic, Gemini) fit OpenAI's spec.
func TestConformanceResponsesClient(t *testing.T) {
	openai := &adapters.OpenAI{Endpoint: provider.Endpoint{BaseURL: "https://openai.invalid/v1"}}
	for _, tc := range append(translatedChat, struct {
		name   string
		p      provider.Provider
		answer string
		stream string
	}{"openai", openai, "openai-answer.json", "openai-stream.sse"}) {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			if err := (Responses{}).Write(w, &router.Result{Status: 200, Format: provider.Chat, Body: chatAnswer(t, tc.p, fake(t, tc.answer))}); err != nil {
				t.Fatal(err)
			}
			validate(t, "openai", "Response", w.Body.Bytes())
			out := writeStream(t, Responses{}.newStream(provider.Chat), chatChunks(t, tc.p, fake(t, tc.stream)), nil)
			types := validateEvents(t, "openai", responsesEvents, out)
			if len(types) < 3 || types[0] != "response.created" || types[len(types)-1] != "response.completed" {
				t.Errorf("expected response.created ... response.completed, got %v", types)
			}
			failed := writeStream(t, Responses{}.newStream(provider.Chat), chatChunks(t, tc.p, fake(t, tc.stream))[:2],
				&router.StreamError{Class: provider.RateLimited, Message: "rate limited"})
			if types := validateEvents(t, "openai", responsesEvents, failed); !slices.Contains(types, "response.failed") {
				t.Errorf("expected a response.failed, got %v", types)
			}
		})
	}
	for _, e := range conformanceErrors {
		w := httptest.NewRecorder()
		Responses{}.WriteError(w, e)
		validate(t, "openai", "ErrorResponse", w.Body.Bytes())
	}
}
