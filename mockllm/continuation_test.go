package mockllm

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// contReply is the Reply of the continuation tests: 26 runes, in 4
// chunks. Continuing "The quick" leaves 17 runes, 3 tokens (4 × 17 / 26
// rounded up), sent as " bro", "wn f", "ox j", "umps.".
const (
	contReply  = "The quick brown fox jumps."
	contChunks = 4
	contRest   = " brown fox jumps."
	contTokens = 3
)

var contPieces = []string{" bro", "wn f", "ox j", "umps."}

// anthropicPrefill is a Messages body ending with the assistant's
// content (a JSON value), plus extra top-level members.
func anthropicPrefill(content, extra string) string {
	return `{"model":"claude-x","max_tokens":64,` + extra + `"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":` + content + `}]}`
}

// chatContinue is a Chat Completions body ending with an assistant
// message (its members after role), plus extra top-level members.
func chatContinue(msg, extra string) string {
	return `{"model":"gpt-test",` + extra + `"messages":[{"role":"user","content":"hi"},{"role":"assistant",` + msg + `}]}`
}

func TestAnthropicContinuation(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    string
		wantOut int
	}{
		{"string", anthropicPrefill(`"The quick"`, ""), contRest, contTokens},
		{"text blocks joined", anthropicPrefill(`[{"type":"text","text":"The "},{"type":"text","text":"quick"}]`, ""), contRest, contTokens},
		{"thinking block first", anthropicPrefill(`[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"The quick"}]`,
			`"thinking":{"type":"enabled","budget_tokens":1024},`), contRest, contTokens},
		{"thinking disabled", anthropicPrefill(`"The quick"`, `"thinking":{"type":"disabled"},`), contRest, contTokens},
		{"the whole reply", anthropicPrefill(`"The quick brown fox jumps."`, ""), "", 0},
		{"reply not starting with the prefill", anthropicPrefill(`"A slow"`, ""), contReply, contChunks},
		{"the reply is a prefix of the prefill", anthropicPrefill(`"The quick brown fox jumps. Then"`, ""), contReply, contChunks},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectAnthropic, Reply: contReply, Chunks: contChunks}, nil)
			resp := s.post(t, "/v1/messages", tt.body)
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("expected 200, got %d: %s", resp.StatusCode, body)
			}
			var m anthropicMsg
			if err := json.Unmarshal([]byte(body), &m); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			if len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text != tt.want {
				t.Errorf("expected the text %q, got %s", tt.want, body)
			}
			if m.StopReason == nil || *m.StopReason != "end_turn" {
				t.Errorf("expected end_turn, got %s", body)
			}
			if m.Usage.InputTokens != tokensOf(tt.body) || m.Usage.OutputTokens != tt.wantOut {
				t.Errorf("expected usage %d/%d, got %+v", tokensOf(tt.body), tt.wantOut, m.Usage)
			}
			if st := s.h.Stats(); st.Continuations != 1 || st.Requests != 1 {
				t.Errorf("expected 1 continuation of 1 request, got %+v", st)
			}

			// Streamed: the same text in Chunks pieces. (Reset empties
			// the prompt cache, which would count the prefix as cached.)
			s.h.Reset()
			sbody := strings.Replace(tt.body, "{", `{"stream":true,`, 1)
			es := readEvents(s.post(t, "/v1/messages", sbody), time.Now())
			if es.err != nil || len(es.events) == 0 || es.events[len(es.events)-1].name != "message_stop" {
				t.Fatalf("expected a complete stream, got %q %v", es.names(), es.err)
			}
			checkAnthropicPrelude(t, es, "claude-x", tokensOf(sbody))
			deltas := anthropicDeltas(t, es)
			if len(deltas) != contChunks || strings.Join(deltas, "") != tt.want {
				t.Errorf("expected %d deltas joining to %q, got %q", contChunks, tt.want, deltas)
			}
			if tt.want == contRest && strings.Join(deltas, "|") != strings.Join(contPieces, "|") {
				t.Errorf("expected the pieces %q, got %q", contPieces, deltas)
			}
			wantDelta := `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":` + strconv.Itoa(tt.wantOut) + `}}`
			if got := es.events[len(es.events)-2].data; got != wantDelta {
				t.Errorf("expected %s, got %s", wantDelta, got)
			}
			if st := s.h.Stats(); st.Continuations != 1 {
				t.Errorf("expected 1 continuation since the reset, got %d", st.Continuations)
			}
		})
	}
}

func TestAnthropicContinuationRejected(t *testing.T) {
	tests := []struct {
		name string
		cfg  Handler
		body string
		want string
	}{
		{"trailing space", Handler{}, anthropicPrefill(`"The quick "`, ""), "final assistant content cannot end with trailing whitespace"},
		{"trailing newline in a block", Handler{}, anthropicPrefill(`[{"type":"text","text":"The quick"},{"type":"text","text":"\n"}]`, ""),
			"final assistant content cannot end with trailing whitespace"},
		{"only whitespace", Handler{}, anthropicPrefill(`"\t"`, ""), "final assistant content cannot end with trailing whitespace"},
		{"thinking", Handler{}, anthropicPrefill(`"The quick"`, `"thinking":{"type":"enabled","budget_tokens":1024},`),
			"Expected `thinking` or `redacted_thinking`, but found `text`. When `thinking` is enabled, a final `assistant` message must start with a thinking block."},
		{"continuation reject", Handler{Continuation: ContinuationReject}, anthropicPrefill(`"The quick"`, ""),
			"assistant message prefill is not supported for this model"},
		{"continuation reject, whatever the prefill", Handler{Continuation: ContinuationReject}, anthropicPrefill(`"A slow"`, ""),
			"assistant message prefill is not supported for this model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Dialect, cfg.Reply, cfg.Chunks = DialectAnthropic, contReply, contChunks
			s := serve(t, cfg, nil)
			for _, body := range []string{tt.body, strings.Replace(tt.body, "{", `{"stream":true,`, 1)} {
				resp := s.post(t, "/v1/messages", body)
				got := readAll(t, resp)
				want := `{"type":"error","error":{"type":"invalid_request_error","message":` + string(must(json.Marshal(tt.want))) + `}}`
				if resp.StatusCode != http.StatusBadRequest || got != want {
					t.Errorf("expected 400 %s, got %d %s", want, resp.StatusCode, got)
				}
			}
			// A request that continues nothing is answered.
			resp := s.post(t, "/v1/messages", anthropicBody)
			if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"text":"`+contReply+`"`) {
				t.Errorf("expected the whole reply, got %d %s", resp.StatusCode, body)
			}
			if st := s.h.Stats(); st.Continuations != 2 || st.Requests != 3 {
				t.Errorf("expected 2 continuations of 3 requests, got %+v", st)
			}
		})
	}
}

// chatText is the content of a Chat Completions answer.
func chatText(t *testing.T, body string) (string, usage) {
	t.Helper()
	var c struct {
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &c); err != nil || len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" ||
		c.Choices[0].FinishReason != "stop" {
		t.Fatalf("expected a chat completion, got %s (%v)", body, err)
	}
	return c.Choices[0].Message.Content, c.Usage
}

func TestChatContinuation(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    string
		wantC   int
		counted bool // as a continuation
	}{
		{"prefix", chatContinue(`"content":"The quick","prefix":true`, ""), contRest, contTokens, true},
		{"prefix with text parts", chatContinue(`"content":[{"type":"text","text":"The "},{"type":"text","text":"quick"}],"prefix":true`, ""), contRest, contTokens, true},
		{"continue_final_message", chatContinue(`"content":"The quick"`, `"continue_final_message":true,"add_generation_prompt":false,`), contRest, contTokens, true},
		{"prefix, trailing whitespace allowed", chatContinue(`"content":"The quick ","prefix":true`, ""), "brown fox jumps.", 3, true},
		{"prefix not followed", chatContinue(`"content":"A slow","prefix":true`, ""), contReply, contChunks, true},
		{"a final assistant message is history", chatContinue(`"content":"The quick"`, ""), contReply, contChunks, false},
		{"prefix false", chatContinue(`"content":"The quick","prefix":false`, ""), contReply, contChunks, false},
		{"continue_final_message after a user message", `{"model":"gpt-test","continue_final_message":true,"add_generation_prompt":false,"messages":[{"role":"user","content":"The quick"}]}`,
			contReply, contChunks, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, Handler{Reply: contReply, Chunks: contChunks}, nil)
			resp := s.post(t, "/v1/chat/completions", tt.body)
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("expected 200, got %d: %s", resp.StatusCode, body)
			}
			text, u := chatText(t, body)
			if text != tt.want {
				t.Errorf("expected %q, got %q", tt.want, text)
			}
			if want := (usage{tokensOf(tt.body), tt.wantC, tokensOf(tt.body) + tt.wantC}); u != want {
				t.Errorf("expected usage %+v, got %+v", want, u)
			}

			sbody := strings.Replace(tt.body, "{", `{"stream":true,`, 1)
			ev := readSSE(s.post(t, "/v1/chat/completions", sbody), time.Now())
			if ev.err != nil || len(ev.data) != contChunks+2 || ev.data[len(ev.data)-1] != "[DONE]" {
				t.Fatalf("expected %d chunks, the final one and [DONE], got %q %v", contChunks, ev.data, ev.err)
			}
			var pieces []string
			for _, d := range ev.data[:contChunks] {
				var c chunk
				if err := json.Unmarshal([]byte(d), &c); err != nil || len(c.Choices) != 1 || c.Choices[0].Delta.Content == nil {
					t.Fatalf("unexpected chunk %s (%v)", d, err)
				}
				pieces = append(pieces, *c.Choices[0].Delta.Content)
			}
			if strings.Join(pieces, "") != tt.want {
				t.Errorf("expected the chunks to join to %q, got %q", tt.want, pieces)
			}
			if tt.want == contRest && strings.Join(pieces, "|") != strings.Join(contPieces, "|") {
				t.Errorf("expected the pieces %q, got %q", contPieces, pieces)
			}
			var final chunk
			_ = json.Unmarshal([]byte(ev.data[contChunks]), &final)
			if want := (usage{tokensOf(sbody), tt.wantC, tokensOf(sbody) + tt.wantC}); final.Usage == nil || *final.Usage != want {
				t.Errorf("expected usage %+v in the final chunk, got %s", want, ev.data[contChunks])
			}
			wantN := int64(0)
			if tt.counted {
				wantN = 2
			}
			if st := s.h.Stats(); st.Continuations != wantN {
				t.Errorf("expected %d continuations, got %d", wantN, st.Continuations)
			}
		})
	}
}

func TestChatContinuationRejected(t *testing.T) {
	tests := []struct {
		name string
		cfg  Handler
		body string
		want string
	}{
		{"continue_final_message with add_generation_prompt by default", Handler{},
			chatContinue(`"content":"The quick"`, `"continue_final_message":true,`),
			"Cannot set both `continue_final_message` and `add_generation_prompt` to True."},
		{"continue_final_message with add_generation_prompt", Handler{},
			chatContinue(`"content":"The quick"`, `"continue_final_message":true,"add_generation_prompt":true,`),
			"Cannot set both `continue_final_message` and `add_generation_prompt` to True."},
		{"continuation reject, prefix", Handler{Continuation: ContinuationReject},
			chatContinue(`"content":"The quick","prefix":true`, ""), "assistant message prefill is not supported for this model"},
		{"continuation reject, continue_final_message", Handler{Continuation: ContinuationReject},
			chatContinue(`"content":"The quick"`, `"continue_final_message":true,"add_generation_prompt":false,`),
			"assistant message prefill is not supported for this model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Reply, cfg.Chunks = contReply, contChunks
			s := serve(t, cfg, nil)
			for _, body := range []string{tt.body, strings.Replace(tt.body, "{", `{"stream":true,`, 1)} {
				resp := s.post(t, "/v1/chat/completions", body)
				got := readAll(t, resp)
				e := decodeError(t, got)
				if resp.StatusCode != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || e.Error.Message != tt.want {
					t.Errorf("expected 400 invalid_request_error %q, got %d %s", tt.want, resp.StatusCode, got)
				}
			}
			// History ending with the assistant's message is no continuation.
			resp := s.post(t, "/v1/chat/completions", chatContinue(`"content":"The quick"`, ""))
			body := readAll(t, resp)
			if text, _ := chatText(t, body); resp.StatusCode != http.StatusOK || text != contReply {
				t.Errorf("expected the whole reply, got %d %s", resp.StatusCode, body)
			}
			if st := s.h.Stats(); st.Continuations != 2 || st.Requests != 3 {
				t.Errorf("expected 2 continuations of 3 requests, got %+v", st)
			}
		})
	}
}

// TestContinuationOtherAPIs: bedrock's invoke and vertex's rawPredict
// continue as Anthropic does, with their own error formats; Converse,
// Gemini and the Responses API have no continuation.
func TestContinuationOtherAPIs(t *testing.T) {
	cfg := Handler{Reply: contReply, Chunks: contChunks}
	invokePrefill := `{"anthropic_version":"bedrock-2023-05-31","max_tokens":64,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"The quick"}]}`

	t.Run("bedrock invoke", func(t *testing.T) {
		c := cfg
		c.Dialect = DialectBedrock
		s := serve(t, c, nil)
		resp := s.post(t, sdkPath(bedrockModel, "invoke"), invokePrefill)
		body := readAll(t, resp)
		var m anthropicMsg
		if err := json.Unmarshal([]byte(body), &m); err != nil || resp.StatusCode != 200 || len(m.Content) != 1 || m.Content[0].Text != contRest ||
			m.Usage.OutputTokens != contTokens || resp.Header.Get("X-Amzn-Bedrock-Output-Token-Count") != strconv.Itoa(contTokens) {
			t.Errorf("expected %q in %d tokens, got %d %s %v", contRest, contTokens, resp.StatusCode, body, resp.Header)
		}
		msgs, err := readFrames(s.post(t, sdkPath(bedrockModel, "invoke-with-response-stream"), invokePrefill), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		var deltas []string
		for _, e := range chunkEvents(t, msgs) {
			if e.Type == "content_block_delta" {
				deltas = append(deltas, e.Delta.Text)
			}
		}
		if strings.Join(deltas, "|") != strings.Join(contPieces, "|") {
			t.Errorf("expected the deltas %q, got %q", contPieces, deltas)
		}
		// Converse: a final assistant message is history.
		conv := `{"messages":[{"role":"user","content":[{"text":"hi"}]},{"role":"assistant","content":[{"text":"The quick"}]}]}`
		body = readAll(t, s.post(t, sdkPath(bedrockModel, "converse"), conv))
		if !strings.Contains(body, `"content":[{"text":"`+contReply+`"}]`) {
			t.Errorf("expected the whole reply from converse, got %s", body)
		}
		if st := s.h.Stats(); st.Continuations != 2 {
			t.Errorf("expected 2 continuations, got %d", st.Continuations)
		}

		c.Continuation = ContinuationReject
		r := serve(t, c, nil)
		resp = r.post(t, sdkPath(bedrockModel, "invoke"), invokePrefill)
		body = readAll(t, resp)
		if resp.StatusCode != 400 || resp.Header.Get("X-Amzn-Errortype") != "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/" ||
			body != `{"message":"assistant message prefill is not supported for this model"}` {
			t.Errorf("expected a 400 ValidationException, got %d %v %s", resp.StatusCode, resp.Header, body)
		}
		resp = r.post(t, sdkPath(bedrockModel, "invoke"), strings.Replace(invokePrefill, `"The quick"`, `"The quick "`, 1))
		if body := readAll(t, resp); resp.StatusCode != 400 || !strings.Contains(body, "prefill is not supported") {
			t.Errorf("expected the rejection first, got %d %s", resp.StatusCode, body)
		}
	})

	t.Run("vertex rawPredict", func(t *testing.T) {
		c := cfg
		c.Dialect = DialectVertex
		s := serve(t, c, nil)
		tok := token(t, s)
		prefill := strings.Replace(vertexClaudeBody, `"content":"hi"}]`, `"content":"hi"},{"role":"assistant","content":[{"type":"text","text":"The quick"}]}]`, 1)
		body := readAll(t, s.post(t, vertexClaude+":rawPredict", prefill, bearer(tok)...))
		var m anthropicMsg
		if err := json.Unmarshal([]byte(body), &m); err != nil || len(m.Content) != 1 || m.Content[0].Text != contRest {
			t.Errorf("expected %q, got %s", contRest, body)
		}
		es := readEvents(s.post(t, vertexClaude+":streamRawPredict", prefill, bearer(tok)...), time.Now())
		if d := anthropicDeltas(t, es); strings.Join(d, "|") != strings.Join(contPieces, "|") {
			t.Errorf("expected the deltas %q, got %q", contPieces, d)
		}
		resp := s.post(t, vertexClaude+":rawPredict", strings.Replace(prefill, `"The quick"`, `"The quick\n"`, 1), bearer(tok)...)
		body = readAll(t, resp)
		if want := `{"type":"error","error":{"type":"invalid_request_error","message":"final assistant content cannot end with trailing whitespace"}}`; resp.StatusCode != 400 || body != want {
			t.Errorf("expected 400 %s, got %d %s", want, resp.StatusCode, body)
		}
		// Gemini models: a final model turn is history.
		gem := `{"contents":[{"role":"user","parts":[{"text":"hi"}]},{"role":"model","parts":[{"text":"The quick"}]}]}`
		body = readAll(t, s.post(t, vertexGemini+":generateContent", gem, bearer(tok)...))
		if !strings.Contains(body, `"text":"`+contReply+`"`) {
			t.Errorf("expected the whole reply, got %s", body)
		}
		if st := s.h.Stats(); st.Continuations != 3 {
			t.Errorf("expected 3 continuations, got %d", st.Continuations)
		}
	})

	t.Run("gemini", func(t *testing.T) {
		c := cfg
		c.Dialect, c.Continuation = DialectGemini, ContinuationReject
		s := serve(t, c, nil)
		gem := `{"contents":[{"role":"user","parts":[{"text":"hi"}]},{"role":"model","parts":[{"text":"The quick"}]}]}`
		resp := s.post(t, geminiGenerate, gem)
		body := readAll(t, resp)
		if resp.StatusCode != 200 || !strings.Contains(body, `"text":"`+contReply+`"`) {
			t.Errorf("expected the whole reply, got %d %s", resp.StatusCode, body)
		}
		if st := s.h.Stats(); st.Continuations != 0 {
			t.Errorf("expected no continuation, got %d", st.Continuations)
		}
	})

	t.Run("responses", func(t *testing.T) {
		s := serve(t, cfg, nil)
		body := readAll(t, s.post(t, "/v1/responses", `{"model":"gpt-test","input":[{"role":"user","content":"hi"},{"role":"assistant","content":"The quick","prefix":true}]}`))
		if !strings.Contains(body, `"text":"`+contReply+`"`) {
			t.Errorf("expected the whole reply, got %s", body)
		}
		if st := s.h.Stats(); st.Continuations != 0 {
			t.Errorf("expected no continuation, got %d", st.Continuations)
		}
	})

	t.Run("tool call", func(t *testing.T) {
		c := cfg
		c.Dialect, c.ToolCall = DialectAnthropic, &ToolCall{Name: "read", Arguments: json.RawMessage(`{"path":"a"}`)}
		s := serve(t, c, nil)
		body := readAll(t, s.post(t, "/v1/messages", anthropicPrefill(`"The quick"`, "")))
		if !strings.Contains(body, `"text":"`+contRest+`"`) || strings.Contains(body, "tool_use") {
			t.Errorf("expected the continuation, not the tool call, got %s", body)
		}
	})
}
