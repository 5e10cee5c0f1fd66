package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
)

// Streams that survive their provider: a stream that breaks after the
// client began to read it (cut, silent, malformed, an error event) is
// taken up by another deployment, and the client reads the whole answer
// the providers would have written in one piece. Where no deployment can
// continue it or replay the same text, it ends with the in-band error.

// sixtyWords is the mocks' answer: 60 words, sent one chunk per word.
var sixtyWords = strings.TrimSpace(strings.Repeat("alpha beta gamma delta epsilon zeta eta theta iota kappa ", 6))

// dep is one provider of a resume test: its type, mock port, the
// provider's extra subdirectives, its upstream model and its mock's body.
type dep struct {
	name, typ string
	port      int
	extra     string
	model     string
	quality   string
	mock      string
	reply     string // "": sixtyWords
}

// resumeRouter is a router on :9080 with one model group "group" over deps.
func resumeRouter(opts, group string, deps ...dep) string {
	var b strings.Builder
	fmt.Fprintf(&b, "http://localhost:9080 {\n\tllm_router /v1/* {\n\t\tdeadline 5s\n\t\t%s\n", opts)
	for _, d := range deps {
		base := fmt.Sprintf("http://localhost:%d/v1", d.port)
		fmt.Fprintf(&b, "\t\tprovider %s {\n\t\t\ttype %s\n\t\t\tapi_key none\n\t\t\tbase_url %s\n\t\t\t%s\n\t\t}\n", d.name, d.typ, base, d.extra)
	}
	fmt.Fprintf(&b, "\t\tmodel %s {\n", group)
	for _, d := range deps {
		fmt.Fprintf(&b, "\t\t\tdeployment %s %s {\n\t\t\t\tquality %s\n\t\t\t}\n", d.name, d.model, orZero(d.quality))
	}
	b.WriteString("\t\t}\n\t}\n}\n")
	for _, d := range deps {
		reply := d.reply
		if reply == "" {
			reply = sixtyWords
		}
		fmt.Fprintf(&b, "http://localhost:%d {\n\tllm_mock {\n\t\treply %q\n\t\tchunks 60\n\t\t%s\n\t}\n}\n", d.port, reply, d.mock)
	}
	return b.String()
}

// continuations reads how many continuation requests an llm_mock got.
func continuations(t *testing.T, port int) (requests, continued int64) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://localhost:%d/llm_mock/stats", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s struct {
		Requests      int64 `json:"requests"`
		Continuations int64 `json:"continuations"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s.Requests, s.Continuations
}

// streamedText reads a Chat Completions stream: its text, its [DONE]s, and
// whether it ended with the in-band error.
func streamedText(t *testing.T, resp *http.Response) (text string, dones int, inBand bool, ids map[string]bool) {
	t.Helper()
	ids = map[string]bool{}
	for _, ev := range readSSE(t, resp) {
		if ev.data == "[DONE]" {
			dones++
			continue
		}
		if strings.Contains(ev.data, `"stream_interrupted"`) {
			inBand = true
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("not a chunk: %s", ev.data)
		}
		ids[c.ID] = true
		for _, ch := range c.Choices {
			text += ch.Delta.Content
		}
	}
	return
}

// The four cases where a complete answer was possible: a cut after
// 40 words, a stall after 20, a malformed event at 10 (each continued by
// a deployment of the same model that takes a prefix), and a cut whose
// fallback refuses the continuation (then asked the request afresh, at
// temperature 0, so that its text can be the same: replayed). Each ends
// with the whole answer, one id, one [DONE].
func TestResumedStreamsEndComplete(t *testing.T) {
	for _, tc := range []struct {
		name, fault, bMock, temperature string
		bRequests, bCont                int64
	}{
		{"cut after 40", "fault cut {\n after 40\n }", "", "", 1, 1},
		{"stall after 20", "fault stall {\n after 20\n }", "", "", 1, 1},
		{"malformed at 10", "fault malformed {\n after 10\n }", "", "", 1, 1},
		{"fallback refuses prefill", "fault cut {\n after 40\n }", "continuation reject", `"temperature":0,`, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := "rs-" + strings.ReplaceAll(tc.name, " ", "-")
			load(t, resumeRouter("", group,
				// Each case its own model: capacity states outlive a reload.
				dep{name: "a", typ: "openai", port: 9081, extra: "idle_timeout 300ms", model: group, quality: "1", mock: tc.fault},
				dep{name: "b", typ: "openai", port: 9082, extra: "continuation prefix", model: group, mock: tc.bMock}))
			start := time.Now()
			resp := chatBody(t, `{"model":"`+group+`","stream":true,`+tc.temperature+`"messages":[{"role":"user","content":"Say hello."}]}`)
			text, dones, inBand, ids := streamedText(t, resp)
			if text != sixtyWords || dones != 1 || inBand || len(ids) != 1 {
				t.Errorf("expected the whole answer, one [DONE], one id; got %d [DONE], in-band %v, ids %v, text %q", dones, inBand, ids, text)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("took %v", took)
			}
			if n, c := continuations(t, 9082); n != tc.bRequests || c != tc.bCont {
				t.Errorf("expected b asked %d times (%d continuations), got %d (%d)", tc.bRequests, tc.bCont, n, c)
			}
			if n, _ := continuations(t, 9081); n != 1 {
				t.Errorf("expected a asked once, got %d", n)
			}
		})
	}
}

// A fallback that can neither continue the text nor write the same one
// (no prefix support; a replay of 40 words, sampled, cannot match): it
// is not asked, and the stream ends with the clean in-band error, never
// as complete; the text the client has is the broken attempt's alone.
func TestAnIncapableFallbackEndsInBand(t *testing.T) {
	load(t, resumeRouter("resume any", "rs-incapable",
		dep{name: "a", typ: "openai", port: 9081, model: "llama-3.3-70b", quality: "1", mock: "fault cut {\n after 40\n }"},
		dep{name: "b", typ: "openai", port: 9082, model: "llama-3.3-70b", reply: "Something else entirely."}))
	text, dones, inBand, _ := streamedText(t, chat(t, "rs-incapable", true))
	if dones != 0 || !inBand || !strings.HasPrefix(sixtyWords, text) || len(text) < len(sixtyWords)/2 || len(text) == len(sixtyWords) {
		t.Errorf("expected a's 40 chunks then the in-band error, got %d [DONE], in-band %v, %q", dones, inBand, text)
	}
	if n, c := continuations(t, 9082); n != 0 || c != 0 {
		t.Errorf("expected b never asked, got %d (%d continuations)", n, c)
	}
}

// A Messages client on Claude: the stream cut on one Claude deployment is
// continued by another serving the same model (prefill), and the SDK
// assembles one message with one text block, its stop reason, and the
// output of both attempts.
func TestAClaudeStreamIsContinuedForTheAnthropicSDK(t *testing.T) {
	load(t, resumeRouter("", "rs-claude",
		dep{name: "a", typ: "anthropic", port: 9081, model: "claude-sonnet-4-5-20250929", quality: "1", mock: "dialect anthropic\n fault cut {\n after 30\n }"},
		dep{name: "b", typ: "anthropic", port: 9082, model: "claude-sonnet-4-5", mock: "dialect anthropic"}))
	var last *http.Response
	client := anthropicClient(&last)
	s := client.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "rs-claude", MaxTokens: 512,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Recite."))}})
	var msg anthropic.Message
	for s.Next() {
		if err := msg.Accumulate(s.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text != sixtyWords || msg.StopReason != "end_turn" {
		t.Errorf("expected one block with the whole answer, end_turn; got %d blocks, %q, %+v", len(msg.Content), msg.StopReason, msg.Content)
	}
	if msg.Usage.OutputTokens < 60 {
		t.Errorf("expected the output of both attempts (at least 60 tokens), got %d", msg.Usage.OutputTokens)
	}
	if _, c := continuations(t, 9082); c != 1 {
		t.Errorf("expected b asked to continue once, got %d", c)
	}
}

// hedge_after: a first attempt slow to its first token gets a hedge on
// the other deployment, which answers first; the headers say so.
func TestASlowFirstTokenIsHedged(t *testing.T) {
	load(t, resumeRouter("hedge_after 200ms", "hedged",
		dep{name: "a", typ: "openai", port: 9081, model: "m", quality: "1", mock: "first_token_delay 3s\n latency 3s"},
		dep{name: "b", typ: "openai", port: 9082, model: "m"}))
	for _, stream := range []bool{true, false} {
		start := time.Now()
		resp := chat(t, "hedged", stream)
		took := time.Since(start)
		if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Router-Hedge") != "won" || resp.Header.Get("X-LLM-Router-Attempts") != "2" ||
			resp.Header.Get("X-LLM-Router-Deployment") != "b/m" {
			t.Errorf("stream=%v: expected b's hedge to answer, got %d %q %q %q", stream, resp.StatusCode, resp.Header.Get("X-LLM-Router-Hedge"),
				resp.Header.Get("X-LLM-Router-Attempts"), resp.Header.Get("X-LLM-Router-Deployment"))
		}
		if stream {
			if text, dones, _, _ := streamedText(t, resp); text != sixtyWords || dones != 1 {
				t.Errorf("expected b's whole stream, got %q", text)
			}
		} else {
			readBody(t, resp)
		}
		if took > 2*time.Second {
			t.Errorf("stream=%v: the hedge should answer well before a's 3 s, took %v", stream, took)
		}
	}
}
