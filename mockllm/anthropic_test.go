package mockllm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	name string // the event: field, "" when absent
	data string
	at   time.Duration // arrival since the request started
}

// eventStream is an event stream parsed event by event, as an
// EventSource would.
type eventStream struct {
	events   []sseEvent
	comments int
	err      error // nil when the stream ended cleanly
}

func (es eventStream) names() []string {
	out := make([]string, len(es.events))
	for i, e := range es.events {
		out[i] = e.name
	}
	return out
}

func readEvents(resp *http.Response, start time.Time) eventStream {
	defer resp.Body.Close()
	var es eventStream
	var cur sseEvent
	var pending bool
	dispatch := func() {
		if pending {
			cur.at = time.Since(start)
			es.events = append(es.events, cur)
		}
		cur, pending = sseEvent{}, false
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		complete := strings.HasSuffix(line, "\n")
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "" && complete:
			dispatch()
		case strings.HasPrefix(line, ":"):
			es.comments++
		case strings.HasPrefix(line, "event: "):
			cur.name, pending = strings.TrimPrefix(line, "event: "), true
		case strings.HasPrefix(line, "data: "):
			if cur.data != "" {
				cur.data += "\n"
			}
			cur.data += strings.TrimPrefix(line, "data: ")
			pending = true
		}
		if err != nil {
			if err != io.EOF {
				es.err = err
			} else {
				dispatch()
			}
			return es
		}
	}
}

const (
	anthropicBody       = `{"model":"claude-x","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	anthropicStreamBody = `{"model":"claude-x","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
)

type anthropicMsg struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Model   string `json:"model"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Usage        struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

type anthropicErr struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeAnthropicError(t *testing.T, body string) anthropicErr {
	t.Helper()
	var e anthropicErr
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	if e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
		t.Errorf("expected an Anthropic error, got %s", body)
	}
	return e
}

func TestAnthropicMessage(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Handler
		wantModel string
		wantReply string
		wantC     int
	}{
		{"defaults", Handler{Dialect: DialectAnthropic}, "claude-x", DefaultReply, DefaultChunks},
		{"configured", Handler{Dialect: DialectAnthropic, Model: "claude-mock", Reply: "é \"q\"\n", Chunks: 2}, "claude-mock", "é \"q\"\n", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, tt.cfg, nil)
			resp := s.post(t, "/v1/messages", anthropicBody)
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("expected 200 application/json, got %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			var m anthropicMsg
			if err := json.Unmarshal([]byte(body), &m); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			if !strings.HasPrefix(m.ID, "msg_mock_") || m.Type != "message" || m.Role != "assistant" || m.Model != tt.wantModel {
				t.Errorf("unexpected message header fields %s", body)
			}
			if len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text != tt.wantReply {
				t.Errorf("expected one text block %q, got %s", tt.wantReply, body)
			}
			if m.StopReason == nil || *m.StopReason != "end_turn" || m.StopSequence != nil || !strings.Contains(body, `"stop_sequence":null`) {
				t.Errorf("expected end_turn and a null stop_sequence, got %s", body)
			}
			if m.Usage.InputTokens != tokensOf(anthropicBody) || m.Usage.OutputTokens != tt.wantC {
				t.Errorf("expected usage %d/%d, got %+v", tokensOf(anthropicBody), tt.wantC, m.Usage)
			}
			if _, err := http.ParseTime(resp.Header.Get("Date")); err != nil {
				t.Errorf("expected a Date header, got %q", resp.Header.Get("Date"))
			}
			if tt.name == "defaults" {
				want := `{"id":"msg_mock_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hello from llm_mock."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":` +
					strconv.Itoa(tokensOf(anthropicBody)) + `,"output_tokens":5}}`
				if body != want {
					t.Errorf("expected exactly %s, got %s", want, body)
				}
			}
		})
	}
}

// checkAnthropicPrelude checks message_start, content_block_start and
// ping, the events every Anthropic stream starts with.
func checkAnthropicPrelude(t *testing.T, es eventStream, model string, input int) {
	t.Helper()
	if len(es.events) < 3 {
		t.Fatalf("expected at least the 3 opening events, got %q", es.names())
	}
	var start struct {
		Type    string       `json:"type"`
		Message anthropicMsg `json:"message"`
	}
	if err := json.Unmarshal([]byte(es.events[0].data), &start); err != nil {
		t.Fatalf("message_start %q: %v", es.events[0].data, err)
	}
	m := start.Message
	if es.events[0].name != "message_start" || start.Type != "message_start" || !strings.HasPrefix(m.ID, "msg_mock_") ||
		m.Type != "message" || m.Role != "assistant" || m.Model != model || m.Content == nil || len(m.Content) != 0 ||
		m.StopReason != nil || m.Usage.InputTokens != input {
		t.Errorf("unexpected message_start %s", es.events[0].data)
	}
	if e := es.events[1]; e.name != "content_block_start" ||
		e.data != `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` {
		t.Errorf("unexpected content_block_start %+v", e)
	}
	if e := es.events[2]; e.name != "ping" || e.data != `{"type": "ping"}` {
		t.Errorf("unexpected ping %+v", e)
	}
}

// anthropicDeltas returns the texts of the content_block_delta events
// of es, checking each.
func anthropicDeltas(t *testing.T, es eventStream) []string {
	t.Helper()
	var out []string
	for _, e := range es.events {
		if e.name != "content_block_delta" {
			continue
		}
		var d struct {
			Type  string `json:"type"`
			Index int    `json:"index"`
			Delta struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(e.data), &d); err != nil {
			t.Fatalf("delta %q: %v", e.data, err)
		}
		if d.Type != "content_block_delta" || d.Index != 0 || d.Delta.Type != "text_delta" || d.Delta.Text == nil {
			t.Fatalf("unexpected delta %s", e.data)
		}
		out = append(out, *d.Delta.Text)
	}
	return out
}

func TestAnthropicStream(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Handler
		wantModel string
		wantReply string
		wantC     int
	}{
		{"defaults", Handler{Dialect: DialectAnthropic}, "claude-x", DefaultReply, DefaultChunks},
		{"one chunk", Handler{Dialect: DialectAnthropic, Chunks: 1, Model: "m"}, "m", DefaultReply, 1},
		{"escaping and empty pieces", Handler{Dialect: DialectAnthropic, Chunks: 6, Reply: "a\"\\\né"}, "claude-x", "a\"\\\né", 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, tt.cfg, nil)
			resp := s.post(t, "/v1/messages", anthropicStreamBody)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("expected a 200 event stream, got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			es := readEvents(resp, time.Now())
			if es.err != nil {
				t.Fatalf("expected a clean end, got %v", es.err)
			}
			want := []string{"message_start", "content_block_start", "ping"}
			for range tt.wantC {
				want = append(want, "content_block_delta")
			}
			want = append(want, "content_block_stop", "message_delta", "message_stop")
			if strings.Join(es.names(), ",") != strings.Join(want, ",") {
				t.Fatalf("expected events %q, got %q", want, es.names())
			}
			for i, e := range es.events {
				var typed struct {
					Type string `json:"type"`
				}
				if err := json.Unmarshal([]byte(e.data), &typed); err != nil || typed.Type != e.name {
					t.Errorf("event %d: expected data of type %q, got %q (%v)", i, e.name, e.data, err)
				}
			}
			checkAnthropicPrelude(t, es, tt.wantModel, tokensOf(anthropicStreamBody))
			if got := strings.Join(anthropicDeltas(t, es), ""); got != tt.wantReply {
				t.Errorf("expected deltas to join to %q, got %q", tt.wantReply, got)
			}
			n := len(es.events)
			if es.events[n-3].data != `{"type":"content_block_stop","index":0}` {
				t.Errorf("unexpected content_block_stop %s", es.events[n-3].data)
			}
			wantDelta := `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":` + strconv.Itoa(tt.wantC) + `}}`
			if es.events[n-2].data != wantDelta {
				t.Errorf("expected message_delta %s, got %s", wantDelta, es.events[n-2].data)
			}
			if es.events[n-1].data != `{"type":"message_stop"}` {
				t.Errorf("unexpected message_stop %s", es.events[n-1].data)
			}
		})
	}
}

func TestAnthropicStreamPacingAndPings(t *testing.T) {
	const ftd = 400 * time.Millisecond
	for _, keepalive := range []bool{false, true} {
		t.Run("keepalive "+strconv.FormatBool(keepalive), func(t *testing.T) {
			cfg := Handler{Dialect: DialectAnthropic, FirstTokenDelay: caddy.Duration(ftd), ChunkInterval: caddy.Duration(10 * time.Millisecond), Chunks: 3}
			if keepalive {
				cfg.Faults = []Fault{{Kind: FaultKeepAlive}, {Kind: FaultStatus, Status: 418}}
			}
			s := serve(t, cfg, nil)
			start := time.Now()
			es := readEvents(s.post(t, "/v1/messages", anthropicStreamBody), start)
			if es.err != nil || len(es.events) == 0 || es.events[len(es.events)-1].name != "message_stop" {
				t.Fatalf("expected a complete stream, got %q %v", es.names(), es.err)
			}
			checkAnthropicPrelude(t, es, "claude-x", tokensOf(anthropicStreamBody))
			pings, firstDelta := 0, -1
			for i, e := range es.events {
				switch {
				case e.name == "ping":
					pings++
				case e.name == "content_block_delta" && firstDelta < 0:
					firstDelta = i
				}
			}
			if es.events[firstDelta].at < ftd {
				t.Errorf("expected the first delta after %s, got %s", ftd, es.events[firstDelta].at)
			}
			wantMin, wantMax := 1, 1 // the ping of the opening events
			if keepalive {
				// plus pings at 0, 100, 200 and 300ms, barring scheduler delays
				wantMin, wantMax = 3, 5
			}
			if pings < wantMin || pings > wantMax {
				t.Errorf("expected %d-%d pings, got %d: %q", wantMin, wantMax, pings, es.names())
			}
			for _, e := range es.events[firstDelta:] {
				if e.name == "ping" {
					t.Errorf("expected no ping after the first delta, got %q", es.names())
				}
			}
			if keepalive { // keepalive never selects plain requests
				resp := s.post(t, "/v1/messages", anthropicBody)
				readAll(t, resp)
				if resp.StatusCode != 418 {
					t.Errorf("expected the next fault for a plain request, got %d", resp.StatusCode)
				}
			}
		})
	}
}

// TestAnthropicPreludeBeforeFirstTokenDelay checks message_start,
// content_block_start and ping are sent before the first token delay,
// as Anthropic does: with a delay of an hour they still arrive.
func TestAnthropicPreludeBeforeFirstTokenDelay(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectAnthropic, FirstTokenDelay: caddy.Duration(time.Hour)}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp := s.postCtx(t, ctx, "/v1/messages", anthropicStreamBody)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var names []string
	for len(names) < 3 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("expected the opening events before the delay, got %q then %v", names, err)
		}
		if name, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "event: "); ok {
			names = append(names, name)
		}
	}
	if strings.Join(names, ",") != "message_start,content_block_start,ping" {
		t.Errorf("expected the opening events, got %q", names)
	}
	cancel()
	select {
	case <-s.returned:
	case <-time.After(2 * time.Second):
		t.Fatal("expected the handler to stop when the client went away")
	}
}

func TestAnthropicRateLimit(t *testing.T) {
	clock := newFakeClock()
	t0 := clock.now().UTC()
	s := serve(t, Handler{Dialect: DialectAnthropic, RateLimit: &RateLimit{Requests: 2, Tokens: 100000, Window: caddy.Duration(10 * time.Second)}}, clock)
	per := tokensOf(anthropicBody) + DefaultChunks
	steps := []struct {
		advance time.Duration
		status  int
		remReq  string
		remTok  int
		reset   time.Time
		retry   string
		rolled  bool
	}{
		{0, 200, "1", 100000 - per, t0.Add(10 * time.Second), "", false},
		{1500 * time.Millisecond, 200, "0", 100000 - 2*per, t0.Add(10 * time.Second), "", false},
		{2 * time.Second, 429, "0", 100000 - 2*per, t0.Add(10 * time.Second), "7", false}, // 6.5s left, rounded up
		{6500 * time.Millisecond, 200, "1", 100000 - per, t0.Add(20 * time.Second), "", true},
	}
	var at time.Duration
	var lastRemaining = 3
	for i, st := range steps {
		clock.advance(st.advance)
		at += st.advance
		resp := s.post(t, "/v1/messages", anthropicBody)
		body := readAll(t, resp)
		if resp.StatusCode != st.status {
			t.Fatalf("step %d: expected %d, got %d: %s", i, st.status, resp.StatusCode, body)
		}
		date, err := http.ParseTime(resp.Header.Get("Date"))
		if err != nil || !date.Equal(t0.Add(at).Truncate(time.Second)) {
			t.Errorf("step %d: expected Date on the mock's clock %s, got %q", i, t0.Add(at), resp.Header.Get("Date"))
		}
		for name, want := range map[string]string{
			"anthropic-ratelimit-requests-limit":     "2",
			"anthropic-ratelimit-requests-remaining": st.remReq,
			"anthropic-ratelimit-tokens-limit":       "100000",
			"anthropic-ratelimit-tokens-remaining":   strconv.Itoa(st.remTok),
			"retry-after":                            st.retry,
			"x-ratelimit-limit-requests":             "",
		} {
			if got := resp.Header.Get(name); got != want {
				t.Errorf("step %d: expected %s %q, got %q", i, name, want, got)
			}
		}
		for _, name := range []string{"anthropic-ratelimit-requests-reset", "anthropic-ratelimit-tokens-reset"} {
			v := resp.Header.Get(name)
			reset, err := time.Parse(time.RFC3339, v)
			if err != nil || !strings.HasSuffix(v, "Z") || !reset.Equal(st.reset) {
				t.Errorf("step %d: expected %s %s (RFC 3339, UTC), got %q", i, name, st.reset.Format(time.RFC3339), v)
			}
		}
		rem, _ := strconv.Atoi(resp.Header.Get("anthropic-ratelimit-requests-remaining"))
		if st.status == 200 && !st.rolled && rem >= lastRemaining {
			t.Errorf("step %d: expected remaining requests to decrease from %d, got %d", i, lastRemaining, rem)
		}
		lastRemaining = rem
		if st.status == 429 {
			if e := decodeAnthropicError(t, body); e.Error.Type != "rate_limit_error" || !strings.Contains(e.Error.Message, "2 requests") {
				t.Errorf("step %d: expected a requests rate_limit_error, got %s", i, body)
			}
		}
	}
	if got := s.h.Stats(); got.RateLimited != 1 {
		t.Errorf("expected 1 rate limited, got %+v", got)
	}

	t.Run("tokens and sub-second reset", func(t *testing.T) {
		clock := newFakeClock()
		clock.advance(300 * time.Millisecond)
		s := serve(t, Handler{Dialect: DialectAnthropic, RateLimit: &RateLimit{Tokens: per}}, clock)
		readAll(t, s.post(t, "/v1/messages", anthropicBody))
		resp := s.post(t, "/v1/messages", anthropicBody)
		body := readAll(t, resp)
		if resp.StatusCode != 429 || resp.Header.Get("retry-after") != "60" {
			t.Fatalf("expected 429 with retry-after 60, got %d %q", resp.StatusCode, resp.Header.Get("retry-after"))
		}
		if e := decodeAnthropicError(t, body); e.Error.Type != "rate_limit_error" || !strings.Contains(e.Error.Message, "tokens per minute") {
			t.Errorf("expected a tokens rate_limit_error, got %s", body)
		}
		// The window ends at 00:01:00.3: the reset rounds up, never early.
		if got := resp.Header.Get("anthropic-ratelimit-tokens-reset"); got != "2025-01-01T00:01:01Z" {
			t.Errorf("expected the reset rounded up to 2025-01-01T00:01:01Z, got %q", got)
		}
		if resp.Header.Get("anthropic-ratelimit-requests-limit") != "" {
			t.Errorf("expected no requests headers without a requests limit")
		}
	})
}

func TestAnthropicAuth(t *testing.T) {
	t.Setenv("LLM_MOCK_TEST_KEY", "sk-ant-secret")
	s := serve(t, Handler{Dialect: DialectAnthropic, APIKey: "{env.LLM_MOCK_TEST_KEY}", RateLimit: &RateLimit{Requests: 5}}, nil)
	tests := []struct {
		name   string
		hdr    []string
		status int
	}{
		{"missing", nil, http.StatusUnauthorized},
		{"wrong", []string{"x-api-key", "sk-ant-other"}, http.StatusUnauthorized},
		{"bearer is not anthropic's", []string{"Authorization", "Bearer sk-ant-secret"}, http.StatusUnauthorized},
		{"right", []string{"x-api-key", "sk-ant-secret", "anthropic-version", "2023-06-01"}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := s.post(t, "/v1/messages", anthropicBody, tt.hdr...)
			body := readAll(t, resp)
			if resp.StatusCode != tt.status {
				t.Fatalf("expected %d, got %d: %s", tt.status, resp.StatusCode, body)
			}
			wantKey := ""
			if len(tt.hdr) > 0 && tt.hdr[0] == "x-api-key" {
				wantKey = tt.hdr[1]
			}
			if got := s.h.Stats().LastAPIKey; got != wantKey {
				t.Errorf("expected last_api_key %q, got %q", wantKey, got)
			}
			if resp.Header.Get("anthropic-ratelimit-requests-limit") != "5" {
				t.Errorf("expected rate-limit headers on every answer, got %v", resp.Header)
			}
			if tt.status != http.StatusUnauthorized {
				return
			}
			want := `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}`
			if body != want {
				t.Errorf("expected %s, got %s", want, body)
			}
			if got := resp.Header.Get("anthropic-ratelimit-requests-remaining"); got != "5" {
				t.Errorf("expected a 401 not to use the rate limit, remaining %q", got)
			}
		})
	}
}

func TestAnthropicBadJSONAndPaths(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectAnthropic}, nil)
	resp := s.post(t, "/v1/messages", `{"model":`)
	body := readAll(t, resp)
	if resp.StatusCode != 400 || decodeAnthropicError(t, body).Error.Type != "invalid_request_error" {
		t.Errorf("expected 400 invalid_request_error, got %d %s", resp.StatusCode, body)
	}
	readAll(t, s.post(t, "/llm_mock/reset", ""))
	for _, tt := range []struct{ method, path string }{
		{http.MethodPost, "/v1/chat/completions"},
		{http.MethodPost, "/v1/embeddings"},
		{http.MethodPost, "/v1beta/models/gemini-x:generateContent"},
		{http.MethodPost, "/v1/messages/count_token"},
		{http.MethodGet, "/v1/messages"},
	} {
		req, _ := http.NewRequest(tt.method, s.srv.URL+tt.path, strings.NewReader(chatBody))
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s: expected 404, got %d", tt.method, tt.path, resp.StatusCode)
		}
	}
	if n := s.h.Stats().Requests; n != 0 {
		t.Errorf("expected misrouted requests not to be counted, got %d", n)
	}
	resp, err := s.srv.Client().Get(s.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			Type string `json:"type"`
			ID   string `json:"id"`
		} `json:"data"`
		HasMore bool `json:"has_more"`
	}
	if err := json.Unmarshal([]byte(readAll(t, resp)), &list); err != nil || len(list.Data) != 1 || list.Data[0].ID != "mock" || list.Data[0].Type != "model" {
		t.Errorf("expected Anthropic's model list, got %+v %v", list, err)
	}
}

func TestAnthropicFaultStatus(t *testing.T) {
	tests := []struct {
		status int
		typ    string
		msg    string
	}{
		{0, "api_error", "mock status 500"}, // default 500
		{400, "invalid_request_error", "mock status 400"},
		{401, "authentication_error", "mock status 401"},
		{402, "billing_error", "mock status 402"},
		{403, "permission_error", "mock status 403"},
		{404, "not_found_error", "mock status 404"},
		{413, "request_too_large", "mock status 413"},
		{418, "invalid_request_error", "mock status 418"},
		{429, "rate_limit_error", "mock status 429"},
		{502, "api_error", "mock status 502"},
		{504, "timeout_error", "mock status 504"},
		{529, "overloaded_error", "Overloaded"},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectAnthropic, Faults: []Fault{{Kind: FaultStatus, Status: tt.status}}}, nil)
			for _, body := range []string{anthropicBody, anthropicStreamBody} {
				resp := s.post(t, "/v1/messages", body)
				got := readAll(t, resp)
				want := statusOr(tt.status, 500)
				if resp.StatusCode != want {
					t.Fatalf("expected %d, got %d", want, resp.StatusCode)
				}
				wantBody := `{"type":"error","error":{"type":"` + tt.typ + `","message":"` + tt.msg + `"}}`
				if got != wantBody {
					t.Errorf("expected %s, got %s", wantBody, got)
				}
			}
		})
	}
}

func TestAnthropicFaultRateLimit(t *testing.T) {
	clock := newFakeClock()
	tests := []struct {
		name  string
		cfg   Handler
		retry string
	}{
		{"default without a window", Handler{Faults: []Fault{{Kind: FaultRateLimit}}}, "60"},
		{"retry_delay rounded up", Handler{Faults: []Fault{{Kind: FaultRateLimit, RetryDelay: caddy.Duration(1500 * time.Millisecond)}}}, "2"},
		{"window end", Handler{RateLimit: &RateLimit{Requests: 10, Window: caddy.Duration(30 * time.Second)}, Faults: []Fault{{Kind: FaultRateLimit}}}, "30"},
		{"header wins", Handler{Faults: []Fault{{Kind: FaultRateLimit, RetryDelay: caddy.Duration(time.Second), Headers: http.Header{"Retry-After": {"9"}}}}}, "9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Dialect = DialectAnthropic
			s := serve(t, tt.cfg, clock)
			resp := s.post(t, "/v1/messages", anthropicStreamBody)
			body := readAll(t, resp)
			if resp.StatusCode != 429 || resp.Header.Get("retry-after") != tt.retry {
				t.Fatalf("expected 429 with retry-after %s, got %d %q", tt.retry, resp.StatusCode, resp.Header.Get("retry-after"))
			}
			if e := decodeAnthropicError(t, body); e.Error.Type != "rate_limit_error" {
				t.Errorf("expected rate_limit_error, got %s", body)
			}
			if tt.cfg.RateLimit != nil && resp.Header.Get("anthropic-ratelimit-requests-remaining") != "9" {
				t.Errorf("expected the faulted request counted in the window, got %v", resp.Header)
			}
		})
	}
}

func TestAnthropicFaultErrorEvent(t *testing.T) {
	const overloaded = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
	tests := []struct {
		name       string
		fault      Fault
		wantDeltas int
		wantData   string
	}{
		{"default", Fault{Kind: FaultErrorEvent}, 1, overloaded},
		{"after 0", Fault{Kind: FaultErrorEvent, After: intp(0)}, 0, overloaded},
		{"after all chunks, custom body", Fault{Kind: FaultErrorEvent, After: intp(DefaultChunks), Body: `{"type":"error","error":{"type":"api_error","message":"boom"}}`},
			DefaultChunks, `{"type":"error","error":{"type":"api_error","message":"boom"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectAnthropic, Faults: []Fault{tt.fault}}, nil)
			resp := s.post(t, "/v1/messages", anthropicStreamBody)
			if resp.StatusCode != 200 {
				t.Fatalf("expected 200, got %d", resp.StatusCode)
			}
			es := readEvents(resp, time.Now())
			if es.err != nil {
				t.Errorf("expected a clean end, got %v", es.err)
			}
			checkAnthropicPrelude(t, es, "claude-x", tokensOf(anthropicStreamBody))
			if n := len(anthropicDeltas(t, es)); n != tt.wantDeltas {
				t.Errorf("expected %d deltas, got %d", tt.wantDeltas, n)
			}
			if len(es.events) != 3+tt.wantDeltas+1 {
				t.Fatalf("expected the opening events, %d deltas and the error, got %q", tt.wantDeltas, es.names())
			}
			last := es.events[len(es.events)-1]
			if last.name != "error" || last.data != tt.wantData {
				t.Errorf("expected event: error %s, got %+v", tt.wantData, last)
			}
		})
	}
	t.Run("plain", func(t *testing.T) {
		s := serve(t, Handler{Dialect: DialectAnthropic, Faults: []Fault{{Kind: FaultErrorEvent}}}, nil)
		resp := s.post(t, "/v1/messages", anthropicBody)
		if body := readAll(t, resp); resp.StatusCode != 529 || body != overloaded {
			t.Errorf("expected 529 %s, got %d %s", overloaded, resp.StatusCode, body)
		}
	})
}

func TestAnthropicFaultCut(t *testing.T) {
	for _, after := range []int{0, 2, DefaultChunks} {
		t.Run("stream after "+strconv.Itoa(after), func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectAnthropic, Faults: []Fault{{Kind: FaultCut, After: intp(after)}}}, nil)
			es := readEvents(s.post(t, "/v1/messages", anthropicStreamBody), time.Now())
			if !errors.Is(es.err, io.ErrUnexpectedEOF) {
				t.Errorf("expected unexpected EOF, got %v", es.err)
			}
			if n := len(anthropicDeltas(t, es)); n != after {
				t.Errorf("expected %d deltas before the cut, got %d", after, n)
			}
			for _, e := range es.events {
				if e.name == "content_block_stop" || e.name == "message_delta" || e.name == "message_stop" {
					t.Errorf("expected no end of message, got %q", es.names())
				}
			}
		})
	}
	t.Run("plain", func(t *testing.T) {
		s := serve(t, Handler{Dialect: DialectAnthropic, Faults: []Fault{{Kind: FaultCut}}}, nil)
		resp := s.post(t, "/v1/messages", anthropicBody)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !errors.Is(err, io.ErrUnexpectedEOF) || int64(len(b)) != resp.ContentLength/2 {
			t.Errorf("expected 200 then half the body and unexpected EOF, got %d %d/%d %v", resp.StatusCode, len(b), resp.ContentLength, err)
		}
	})
}

// TestDialectFaultHang hangs a request of every dialect until the
// client gives up.
func TestDialectFaultHang(t *testing.T) {
	for _, tt := range []struct{ dialect, path, body string }{
		{DialectOpenAI, "/v1/chat/completions", streamBody},
		{DialectAnthropic, "/v1/messages", anthropicStreamBody},
		{DialectAnthropic, "/v1/messages", anthropicBody},
		{DialectGemini, "/v1beta/models/gemini-x:streamGenerateContent?alt=sse", geminiBody},
		{DialectGemini, "/v1beta/models/gemini-x:generateContent", geminiBody},
	} {
		t.Run(tt.dialect+tt.path, func(t *testing.T) {
			s := serve(t, Handler{Dialect: tt.dialect, Faults: []Fault{{Kind: FaultHang}}}, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+tt.path, strings.NewReader(tt.body))
				resp, err := s.srv.Client().Do(req)
				if err == nil {
					resp.Body.Close()
					err = errors.New("got status " + strconv.Itoa(resp.StatusCode))
				}
				errc <- err
			}()
			waitRequests(t, s.h, 1)
			select {
			case err := <-errc:
				t.Fatalf("expected no answer, got %v", err)
			case <-time.After(30 * time.Millisecond):
			}
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Errorf("expected the client's cancellation, got %v", err)
			}
			select {
			case <-s.returned:
			case <-time.After(2 * time.Second):
				t.Fatal("expected the handler to return once the client went away")
			}
			if st := s.h.Stats(); st.Faults != 1 {
				t.Errorf("expected 1 fault, got %+v", st)
			}
		})
	}
}

func TestAnthropicFaultMalformed(t *testing.T) {
	const broken = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x`
	for _, after := range []int{0, 2, DefaultChunks} {
		t.Run("stream after "+strconv.Itoa(after), func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectAnthropic, Faults: []Fault{{Kind: FaultMalformed, After: intp(after)}}}, nil)
			es := readEvents(s.post(t, "/v1/messages", anthropicStreamBody), time.Now())
			if es.err != nil {
				t.Errorf("expected the stream to end cleanly, got %v", es.err)
			}
			if len(es.events) != 3+after+1 {
				t.Fatalf("expected the prelude, %d deltas and the broken one, got %q", after, es.names())
			}
			checkAnthropicPrelude(t, es, "claude-x", tokensOf(anthropicStreamBody))
			good := es
			good.events = es.events[:3+after]
			if got, want := strings.Join(anthropicDeltas(t, good), ""), strings.Join(splitReply(DefaultReply, DefaultChunks)[:after], ""); got != want {
				t.Errorf("expected %q before the broken event, got %q", want, got)
			}
			last := es.events[len(es.events)-1]
			if last.name != "content_block_delta" || last.data != broken || json.Valid([]byte(last.data)) {
				t.Errorf("expected the broken content_block_delta %s, got %+v", broken, last)
			}
		})
	}
	t.Run("plain", func(t *testing.T) {
		clock := newFakeClock()
		want := readAll(t, serve(t, Handler{Dialect: DialectAnthropic}, clock).post(t, "/v1/messages", anthropicBody))
		s := serve(t, Handler{Dialect: DialectAnthropic, Faults: []Fault{{Kind: FaultMalformed}}}, clock)
		resp := s.post(t, "/v1/messages", anthropicBody)
		body := readAll(t, resp)
		if resp.StatusCode != 200 || body != want[:len(want)/2] || json.Valid([]byte(body)) || resp.ContentLength != int64(len(body)) {
			t.Errorf("expected 200 with the first half of %s, got %d %s", want, resp.StatusCode, body)
		}
	})
}
