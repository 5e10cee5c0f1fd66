package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// threeDialects is a router with one model group over an openai (:9081), an
// anthropic (:9082) and a gemini (:9083) deployment, ranked in that order
// (by quality), with each mock's own settings.
func threeDialects(group, prefix, oa, an, gm string) string {
	return dialects(group, prefix, "1", "0.6", oa, an, gm)
}

// dialects is threeDialects with the openai and anthropic qualities given.
func dialects(group, prefix, qualityOA, qualityAN, oa, an, gm string) string {
	return fmt.Sprintf(`
http://localhost:9080 {
	llm_router /v1/* {
		provider oa {
			type openai
			base_url http://localhost:9081/v1
			api_key sk-oa
		}
		provider an {
			type anthropic
			base_url http://localhost:9082/v1
			api_key sk-ant
		}
		provider gm {
			type gemini
			base_url http://localhost:9083/v1beta
			api_key gm-key
		}
		model %[1]s {
			deployment oa %[2]s-gpt {
				quality %[6]s
			}
			deployment an %[2]s-claude {
				quality %[7]s
			}
			deployment gm %[2]s-gemini {
				quality 0.2
			}
		}
	}
}
http://localhost:9081 {
	llm_mock {
		api_key sk-oa
		reply "Hello from gpt."
		%[3]s
	}
}
http://localhost:9082 {
	llm_mock {
		dialect anthropic
		api_key sk-ant
		reply "Hello from claude."
		%[4]s
	}
}
http://localhost:9083 {
	llm_mock {
		dialect gemini
		api_key gm-key
		reply "Hello from gemini."
		%[5]s
	}
}
`, group, prefix, oa, an, gm, qualityOA, qualityAN)
}

func openAIClient(last **http.Response) openai.Client {
	return openai.NewClient(option.WithBaseURL(routerURL+"/v1/"), option.WithAPIKey("client-key"),
		option.WithMaxRetries(0), option.WithResponseInto(last))
}

func anthropicClient(last **http.Response) anthropic.Client {
	return anthropic.NewClient(aoption.WithBaseURL(routerURL+"/"), aoption.WithAPIKey("client-key"),
		aoption.WithMaxRetries(0), aoption.WithResponseInto(last))
}

// One request fails over across three wire formats: the OpenAI deployment
// is rate-limited, the Anthropic one overloaded, Gemini answers.
func TestMixedGroupFailsOverAcrossDialects(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			prefix := fmt.Sprintf("mx%v", stream)
			load(t, threeDialects("mix", prefix,
				"fault rate_limit {\n header Retry-After 30\n }",
				"fault status {\n status 529\n }", "chunks 3"))
			var last *http.Response
			client := openAIClient(&last)
			params := openai.ChatCompletionNewParams{Model: "mix",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Say hello.")}}
			var content, model string
			if stream {
				s := client.Chat.Completions.NewStreaming(context.Background(), params)
				acc := openai.ChatCompletionAccumulator{}
				for s.Next() {
					acc.AddChunk(s.Current())
				}
				if err := s.Err(); err != nil {
					t.Fatal(err)
				}
				content, model = acc.Choices[0].Message.Content, acc.Model
			} else {
				c, err := client.Chat.Completions.New(context.Background(), params)
				if err != nil {
					t.Fatal(err)
				}
				content, model = c.Choices[0].Message.Content, c.Model
			}
			if content != "Hello from gemini." || model != prefix+"-gemini" {
				t.Errorf("expected gemini's answer naming its model, got %q from %q", content, model)
			}
			if last.Header.Get("X-LLM-Router-Deployment") != "gm/"+prefix+"-gemini" || last.Header.Get("X-LLM-Router-Attempts") != "3" {
				t.Errorf("expected gm after 3 attempts, got %q after %q", last.Header.Get("X-LLM-Router-Deployment"), last.Header.Get("X-LLM-Router-Attempts"))
			}
			for port, want := range map[int]int64{9081: 1, 9082: 1, 9083: 1} {
				if n := stats(t, port).Requests; n != want {
					t.Errorf("expected %d attempt at :%d, got %d", want, port, n)
				}
			}
			if s := stats(t, 9082); s.LastModel != prefix+"-claude" {
				t.Errorf("expected the anthropic mock asked for %s-claude, got %q", prefix, s.LastModel)
			}
			if s := stats(t, 9083); s.LastModel != prefix+"-gemini" {
				t.Errorf("expected the gemini mock asked for %s-gemini, got %q", prefix, s.LastModel)
			}
		})
	}
}

// The official Anthropic SDK against the router: served natively by the
// anthropic deployment, and translated by the openai one when the anthropic
// one is rate-limited; streaming and not.
func TestAnthropicSDK(t *testing.T) {
	for _, tc := range []struct {
		name, an, wantText, wantDeployment string
		native                             bool
	}{
		{"native", "chunks 3", "Hello from claude.", "an/%s-claude", true},
		{"translated", "fault rate_limit {\n header retry-after 30\n }", "Hello from gpt.", "oa/%s-gpt", false},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%v", tc.name, stream), func(t *testing.T) {
				prefix := fmt.Sprintf("as-%s-%v", tc.name, stream)
				// Here anthropic ranks first: the openai deployment is the fallback.
				load(t, dialects("claude", prefix, "0.6", "1", "chunks 4", tc.an, ""))
				var last *http.Response
				client := anthropicClient(&last)
				params := anthropic.MessageNewParams{
					Model: "claude", MaxTokens: 256,
					System:   []anthropic.TextBlockParam{{Text: "Be brief."}},
					Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))},
					Metadata: anthropic.MetadataParam{UserID: anthropic.String("user-42")},
				}
				// Chat Completions has no top_k: only a native pass keeps it.
				topK := aoption.WithJSONSet("top_k", 5)
				var msg anthropic.Message
				if stream {
					s := client.Messages.NewStreaming(context.Background(), params, topK)
					for s.Next() {
						if err := msg.Accumulate(s.Current()); err != nil {
							t.Fatal(err)
						}
					}
					if err := s.Err(); err != nil {
						t.Fatal(err)
					}
				} else {
					m, err := client.Messages.New(context.Background(), params, topK)
					if err != nil {
						t.Fatal(err)
					}
					msg = *m
				}
				text := ""
				for _, b := range msg.Content {
					text += b.AsText().Text
				}
				if text != tc.wantText {
					t.Errorf("expected %q, got %q (%+v)", tc.wantText, text, msg)
				}
				if msg.StopReason != anthropic.StopReasonEndTurn {
					t.Errorf("expected stop reason end_turn, got %q", msg.StopReason)
				}
				if msg.Usage.OutputTokens == 0 {
					t.Errorf("expected usage, got %+v", msg.Usage)
				}
				if want := fmt.Sprintf(tc.wantDeployment, prefix); last.Header.Get("X-LLM-Router-Deployment") != want {
					t.Errorf("expected %s to answer, got %q", want, last.Header.Get("X-LLM-Router-Deployment"))
				}
				if tc.native {
					// Native: the body reached Anthropic as the client wrote it,
					// with the upstream model and its metadata intact.
					s := stats(t, 9082)
					if !strings.Contains(s.LastBody, `"top_k":5`) || !strings.Contains(s.LastBody, `"user_id":"user-42"`) || s.LastModel != prefix+"-claude" {
						t.Errorf("expected the client's Messages body passed natively, got %s", s.LastBody)
					}
					if s.LastAPIKey != "sk-ant" {
						t.Errorf("expected the provider's key, got %q", s.LastAPIKey)
					}
				}
			})
		}
	}
}

// The OpenAI SDK served by an Anthropic deployment (translated both ways).
func TestOpenAISDKServedByAnthropic(t *testing.T) {
	load(t, threeDialects("oaa", "oaa", "fault rate_limit {\n header Retry-After 30\n }", "chunks 3", ""))
	var last *http.Response
	client := openAIClient(&last)
	params := openai.ChatCompletionNewParams{Model: "oaa", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	c, err := client.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if c.Choices[0].Message.Content != "Hello from claude." || c.Choices[0].FinishReason != "stop" || c.Usage.TotalTokens == 0 {
		t.Errorf("expected claude's answer as a chat completion, got %+v", c)
	}
	s := client.Chat.Completions.NewStreaming(context.Background(), params)
	acc := openai.ChatCompletionAccumulator{}
	for s.Next() {
		acc.AddChunk(s.Current())
	}
	if err := s.Err(); err != nil || acc.Choices[0].Message.Content != "Hello from claude." {
		t.Errorf("expected claude's streamed answer, got %+v (%v)", acc.Choices, err)
	}
	if last.Header.Get("X-LLM-Router-Deployment") != "an/oaa-claude" {
		t.Errorf("expected an to answer, got %q", last.Header.Get("X-LLM-Router-Deployment"))
	}
}

// Anthropic clients get errors in Anthropic's format, and a mid-stream
// failure in Anthropic's in-band form.
func TestAnthropicIngressErrors(t *testing.T) {
	load(t, threeDialects("ae", "ae", "chunks 5\n fault error_event {\n after 2\n }", "fault status {\n status 529\n }", "fault status {\n status 503\n }"))
	var last *http.Response
	client := anthropicClient(&last)
	_, err := client.Messages.New(context.Background(), anthropic.MessageNewParams{Model: "nope", MaxTokens: 10,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(apiErr.RawJSON(), `"type":"not_found_error"`) {
		t.Errorf("expected a 404 not_found_error, got %v", err)
	}
	resp, err := http.Post(routerURL+"/v1/messages", "application/json", strings.NewReader(`{"model":"ae","messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 400 || !strings.Contains(body, `"type":"invalid_request_error"`) {
		t.Errorf("expected a 400 invalid_request_error, got %d %s", resp.StatusCode, body)
	}

	// The openai deployment answers first and fails after two chunks.
	s := client.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "ae", MaxTokens: 10,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	var msg anthropic.Message
	for s.Next() {
		_ = msg.Accumulate(s.Current())
	}
	if s.Err() == nil {
		t.Errorf("expected the SDK to see the in-band error, got a complete message %+v", msg)
	}
}

func TestEmbeddingsFailOver(t *testing.T) {
	load(t, twoProviders("", "emb", "emb-a", "emb-b", "fault status {\n status 503\n }", ""))
	var last *http.Response
	client := openAIClient(&last)
	e, err := client.Embeddings.New(context.Background(), openai.EmbeddingNewParams{
		Model: "emb", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hello")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Data) != 1 || len(e.Data[0].Embedding) == 0 || e.Model != "emb-b" {
		t.Errorf("expected b's embedding, got %+v", e)
	}
	if last.Header.Get("X-LLM-Router-Attempts") != "2" {
		t.Errorf("expected 2 attempts, got %q", last.Header.Get("X-LLM-Router-Attempts"))
	}
	resp, err := http.Post(routerURL+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"emb"}`))
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 400 || !strings.Contains(body, `"param":"input"`) {
		t.Errorf("expected 400 for a missing input, got %d %s", resp.StatusCode, body)
	}
}

// What the Chat Completions form cannot express still reaches the group's
// anthropic deployments natively, with the client's beta headers; a group
// without one answers 400.
func TestAnthropicIngressNativeOnlyFeatures(t *testing.T) {
	load(t, dialects("nat", "nat", "0.6", "1", "", "", ""))
	body := `{"model":"nat","max_tokens":50,"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":2}],` +
		`"messages":[{"role":"user","content":"What is new?"}]}`
	req, _ := http.NewRequest(http.MethodPost, routerURL+"/v1/messages", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Anthropic-Beta", "context-1m-2025-08-07")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if b := readBody(t, resp); resp.StatusCode != 200 || resp.Header.Get("X-LLM-Router-Deployment") != "an/nat-claude" {
		t.Fatalf("expected the anthropic deployment to answer natively, got %d from %q: %s", resp.StatusCode, resp.Header.Get("X-LLM-Router-Deployment"), b)
	}
	s := stats(t, 9082)
	if !strings.Contains(s.LastBody, "web_search_20250305") || s.LastHeaders["Anthropic-Beta"] != "context-1m-2025-08-07" {
		t.Errorf("expected the server tool and the beta header passed on, got %s %v", s.LastBody, s.LastHeaders)
	}
	if n := stats(t, 9081).Requests; n != 0 {
		t.Errorf("the openai deployment cannot take it and must not be tried, got %d", n)
	}

	load(t, twoProviders("", "noant", "noant-a", "noant-b", "", ""))
	resp, err = http.Post(routerURL+"/v1/messages", "application/json", strings.NewReader(strings.Replace(body, `"nat"`, `"noant"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if b := readBody(t, resp); resp.StatusCode != 400 || !strings.Contains(b, `"invalid_request_error"`) {
		t.Errorf("expected 400 without an anthropic deployment, got %d %s", resp.StatusCode, b)
	}
}

func TestEmbeddingsNeedAnEmbedder(t *testing.T) {
	// Anthropic and Gemini only: neither serves embeddings.
	cfg := strings.Replace(dialects("noemb", "noemb", "0", "1", "", "", ""), "\t\t\tdeployment oa noemb-gpt {\n\t\t\t\tquality 0\n\t\t\t}\n", "", 1)
	load(t, cfg)
	resp, err := http.Post(routerURL+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"noemb","input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	if b := readBody(t, resp); resp.StatusCode != 400 || !strings.Contains(b, "model_not_supported") {
		t.Errorf("expected 400 model_not_supported, got %d %s", resp.StatusCode, b)
	}
}
