package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// dialect is a provider family's wire format: its requests, rate-limit
// headers, errors, answers and streams (PROVIDERS.md; the bodies are
// those of /work/shared/fixtures/providers).
type dialect interface {
	// state writes the statement of ws made at at (admission).
	state(h http.Header, ws []*window, at time.Time)
	// errorBody is the body of an error of kind: "limited", "tokens",
	// "refused" or "overload" (the keys of openAIErrors).
	errorBody(kind, message string) string
	answer(id, model, text string, in, out int64) string
	// events are a stream's events: before the text, one per word, after.
	events(id, model string, words []string, in, out int64) []string
	// failure is a mid-stream error event.
	failure() string
	// head is how many of a stream's events come before its first word.
	head() int
}

// upstream is what a provider reads of an attempt's body.
type upstream struct {
	id        int    // the simulated request's number (from its prompt)
	prompt    int64  // characters of every message
	maxTokens int64  // 0: unset
	stream    bool   //
	prefill   string // the text of a final assistant message ("" none)
	greedy    bool   // temperature 0: every attempt writes the same answer
	key       string // the API key it came with
}

// tokens is the provider's estimate at admission: characters / 4 and
// max_tokens (PROVIDERS.md: OpenAI's token admission).
func (u upstream) tokens() int64 { return (u.prompt+3)/4 + u.maxTokens }

// parseUpstream reads a Chat Completions or Messages body: both have
// messages of a role and a content (a string, or blocks of text).
func parseUpstream(body []byte) (upstream, error) {
	var b struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		MaxTokens    int64    `json:"max_tokens"`
		MaxCompleted int64    `json:"max_completion_tokens"`
		Stream       bool     `json:"stream"`
		Temperature  *float64 `json:"temperature"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return upstream{}, err
	}
	u := upstream{id: -1, maxTokens: max(b.MaxTokens, b.MaxCompleted), stream: b.Stream,
		greedy: b.Temperature != nil && *b.Temperature == 0}
	for i, m := range b.Messages {
		text := contentText(m.Content)
		u.prompt += int64(len(text))
		if u.id < 0 {
			fmt.Sscanf(text, "r%d", &u.id)
		}
		if i == len(b.Messages)-1 && m.Role == "assistant" {
			u.prefill = text
		}
	}
	return u, nil
}

// contentText is a message content's text: a string, or its text blocks.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &blocks)
	var b strings.Builder
	for _, bl := range blocks {
		b.WriteString(bl.Text)
	}
	return b.String()
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// openAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}, resets as
// Go durations ("6m0s", "1s", "17ms").
type openAI struct{}

func (openAI) state(h http.Header, ws []*window, at time.Time) {
	for _, w := range ws {
		kind := "requests"
		if w.tokens {
			kind = "tokens"
		}
		h.Set("x-ratelimit-limit-"+kind, strconv.FormatInt(w.max, 10))
		h.Set("x-ratelimit-remaining-"+kind, strconv.FormatInt(max(w.room(at), 0), 10))
		h.Set("x-ratelimit-reset-"+kind, w.reset(at).Round(time.Millisecond).String())
	}
}

// floorSecs: OpenAI's headers from a compatible server that states its
// resets in whole seconds rounded down, plain ("8") or as a Go duration
// ("8s"): the true reset is up to a second later than stated.
type floorSecs struct {
	openAI
	plain bool
}

func (f floorSecs) state(h http.Header, ws []*window, at time.Time) {
	f.openAI.state(h, ws, at)
	for _, w := range ws {
		kind := "requests"
		if w.tokens {
			kind = "tokens"
		}
		d := w.reset(at).Truncate(time.Second)
		if f.plain {
			h.Set("x-ratelimit-reset-"+kind, strconv.Itoa(int(d/time.Second)))
		} else {
			h.Set("x-ratelimit-reset-"+kind, d.String())
		}
	}
}

var openAIErrors = map[string]string{
	"server":   `{"error":{"message":%s,"type":"server_error","param":null,"code":null}}`,
	"auth":     `{"error":{"message":%s,"type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
	"denied":   `{"error":{"message":%s,"type":"invalid_request_error","param":null,"code":"unsupported_country_region_territory"}}`,
	"billing":  `{"error":{"message":%s,"type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
	"limited":  `{"error":{"message":%s,"type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
	"tokens":   `{"error":{"message":%s,"type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
	"refused":  `{"error":{"message":%s,"type":"invalid_request_error","param":"messages","code":null}}`,
	"overload": `{"error":{"message":%s,"type":"server_error","param":null,"code":null}}`,
}

func (openAI) errorBody(kind, message string) string {
	return fmt.Sprintf(openAIErrors[kind], quote(message))
}

func (openAI) answer(id, model, text string, in, out int64) string {
	return fmt.Sprintf(`{"id":"chatcmpl-%s","object":"chat.completion","created":946684800,"model":%s,"choices":[{"index":0,"message":{"role":"assistant","content":%s},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
		id, quote(model), quote(text), in, out, in+out)
}

func (openAI) events(id, model string, words []string, in, out int64) []string {
	chunk := func(delta, finish string) string {
		return fmt.Sprintf("data: {\"id\":\"chatcmpl-%s\",\"object\":\"chat.completion.chunk\",\"created\":946684800,\"model\":%s,\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}]}\n\n",
			id, quote(model), delta, finish)
	}
	evs := []string{chunk(`{"role":"assistant","content":""}`, "null")}
	for _, w := range words {
		evs = append(evs, chunk(`{"content":`+quote(w)+`}`, "null"))
	}
	return append(evs, chunk(`{}`, `"stop"`), "data: [DONE]\n\n")
}

func (openAI) head() int { return 1 }

func (openAI) failure() string {
	return "data: {\"error\":{\"message\":\"The server had an error while processing your request.\",\"type\":\"server_error\",\"code\":null}}\n\n"
}

// anthropic: anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset},
// resets as RFC 3339 instants (whole seconds), read against Date.
type anthropic struct{}

func (anthropic) state(h http.Header, ws []*window, at time.Time) {
	for _, w := range ws {
		kind := "requests"
		if w.tokens {
			kind = "tokens"
		}
		reset := at.Add(w.reset(at))
		h.Set("anthropic-ratelimit-"+kind+"-limit", strconv.FormatInt(w.max, 10))
		h.Set("anthropic-ratelimit-"+kind+"-remaining", strconv.FormatInt(max(w.room(at), 0), 10))
		h.Set("anthropic-ratelimit-"+kind+"-reset", reset.Add(time.Second-1).Truncate(time.Second).UTC().Format(time.RFC3339))
	}
}

var anthropicErrors = map[string]string{
	"server":   "api_error",
	"auth":     "authentication_error",
	"denied":   "permission_error",
	"billing":  "billing_error",
	"limited":  "rate_limit_error",
	"tokens":   "rate_limit_error",
	"refused":  "invalid_request_error",
	"overload": "overloaded_error",
}

func (anthropic) errorBody(kind, message string) string {
	return fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%s},"request_id":"req_sim"}`, anthropicErrors[kind], quote(message))
}

func (anthropic) answer(id, model, text string, in, out int64) string {
	return fmt.Sprintf(`{"id":"msg_%s","type":"message","role":"assistant","model":%s,"content":[{"type":"text","text":%s}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":%d}}`,
		id, quote(model), quote(text), in, out)
}

func (anthropic) events(id, model string, words []string, in, out int64) []string {
	ev := func(name, data string) string { return "event: " + name + "\ndata: " + data + "\n\n" }
	evs := []string{
		ev("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_%s","type":"message","role":"assistant","model":%s,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":1}}}`, id, quote(model), in)),
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
	}
	for _, w := range words {
		evs = append(evs, ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":`+quote(w)+`}}`))
	}
	return append(evs, ev("content_block_stop", `{"type":"content_block_stop","index":0}`),
		ev("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d}}`, out)),
		ev("message_stop", `{"type":"message_stop"}`))
}

func (anthropic) head() int { return 2 }

func (anthropic) failure() string {
	return "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
}

// retryAfter is how a 429 states its wait: none, seconds, or an HTTP date.
type retryAfter uint8

const (
	retrySeconds retryAfter = iota
	retryNone
	retryDate
)

// setRetryAfter writes wait, stated at at, as r says.
func setRetryAfter(h http.Header, r retryAfter, at time.Time, wait time.Duration) {
	switch r {
	case retrySeconds:
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
	case retryDate:
		h.Set("Retry-After", at.Add(wait+time.Second-1).UTC().Format(http.TimeFormat))
	}
}
