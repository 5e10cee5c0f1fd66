package resume

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// A continuation's body in each client format: the text as the
// assistant's final message, joined to one the client wrote itself.
func TestBody(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    provider.Format
		body string
		want string
	}{
		{"chat", provider.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hello"}],"stream":true}`},
		{"chat prefill", provider.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"{"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"{Hello"}]}`},
		{"messages", provider.Messages, `{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"Hello"}]}]}`},
		{"messages prefill blocks", provider.Messages, `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"Answer: "}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"Answer: Hello"}]}]}`},
		{"messages after a tool result", provider.Messages, `{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"4"}]}]}`,
			`{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"4"}]},{"role":"assistant","content":[{"type":"text","text":"Hello"}]}]}`},
		{"responses string", provider.Responses, `{"model":"m","input":"hi"}`,
			`{"model":"m","input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello"}]}]}`},
		{"responses items", provider.Responses, `{"model":"m","input":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello"}]}]}`},
	} {
		got, err := Body(tc.f, []byte(tc.body), "Hello")
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !jsontest.Same(t, got, tc.want) {
			t.Errorf("%s: wrong body", tc.name)
		}
	}
	for _, bad := range []string{`{"model":"m"}`, `{"model":"m","messages":[]}`, `{"model":"m","messages":"x"}`, `[1]`} {
		if _, err := Body(provider.Chat, []byte(bad), "x"); err == nil {
			t.Errorf("%s: expected an error", bad)
		}
	}
}

// A Messages stream whose text block had closed: the continuation's blocks
// follow it (its first block keeps its start, indexes shifted), and a
// replay cannot take its place.
func TestSpliceAfterAClosedBlock(t *testing.T) {
	tr := New(provider.Messages)
	for _, ev := range []string{
		`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":5,"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"One. "}}`,
		`{"type":"content_block_stop","index":0}`,
	} {
		tr.Add(provider.Event{Data: []byte(ev)})
	}
	if tr.CanReplay() || tr.Resumable() != nil || tr.Text() != "One. " {
		t.Fatalf("expected a resumable transcript that cannot be replayed, text %q", tr.Text())
	}
	prefix, s := tr.Prefix(provider.Usage{InputTokens: 5, OutputTokens: 2})
	if prefix != "One." {
		t.Errorf("expected the prefix without its space, got %q", prefix)
	}
	var out []string
	for _, ev := range []string{
		`{"type":"message_start","message":{"id":"n","usage":{"input_tokens":7,"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" Two."}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}`,
	} {
		got, err := s.Event(provider.Event{Data: []byte(ev)})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range got {
			out = append(out, string(g.Data))
		}
	}
	want := []string{
		`{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Two."}}`,
		`{"type":"content_block_stop","index":1}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"input_tokens":12,"output_tokens":5}}`,
	}
	if len(out) != len(want) {
		t.Fatalf("expected %d events, got %q", len(want), out)
	}
	for i := range want {
		if !jsontest.Same(t, []byte(out[i]), want[i]) {
			t.Errorf("event %d: expected %s, got %s", i, want[i], out[i])
		}
	}
	if tr.Text() != "One. Two." {
		t.Errorf("expected the transcript to read on, got %q", tr.Text())
	}
}

// What cannot be continued: tool calls, reasoning, refusals, more than
// one choice, a finished answer, a Responses stream.
func TestNotResumable(t *testing.T) {
	for name, ev := range map[string]string{
		"tool call": `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`,
		"reasoning": `{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}`,
		"refusal":   `{"choices":[{"index":0,"delta":{"refusal":"no"}}]}`,
		"choices":   `{"choices":[{"index":1,"delta":{"content":"x"}}]}`,
		"finished":  `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
	} {
		tr := New(provider.Chat)
		tr.Add(provider.Event{Data: []byte(`{"id":"a","choices":[{"index":0,"delta":{"content":"x"}}]}`)})
		tr.Add(provider.Event{Data: []byte(ev)})
		if tr.Resumable() == nil {
			t.Errorf("%s: expected not resumable", name)
		}
	}
	for name, ev := range map[string]string{
		"tool_use": `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f"}}`,
		"thinking": `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}`,
	} {
		tr := New(provider.Messages)
		tr.Add(provider.Event{Data: []byte(ev)})
		if tr.Resumable() == nil {
			t.Errorf("%s: expected not resumable", name)
		}
	}
	if err := New(provider.Responses).Resumable(); err == nil || !strings.Contains(err.Error(), "responses") {
		t.Errorf("expected a Responses stream refused, got %v", err)
	}
}

// The byte scan reads what decoding reads: escapes, spaces, logprobs'
// content, a usage chunk, an index that is not a choice's.
func TestTranscriptReadsEveryChunkAsDecoded(t *testing.T) {
	chunks := []string{
		`{"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"a","choices":[{"index":0,"delta":{"content":"He said \"hi\"\n"},"finish_reason":null}]}`,
		`{"id":"a","choices":[{"index":0,"delta":{"content": "spaced "},"finish_reason":null}]}`,
		`{"id":"a","choices":[{"index":0,"delta":{"content":"caf\u00e9 "},"finish_reason":null}]}`,
		`{"id":"a","choices":[{"index":0,"delta":{"content":"tab\there "},"logprobs":{"content":[{"token":"x","logprob":-1}]},"finish_reason":null}]}`,
		`{"id":"a","choices":[{"index":0,"delta":{"content":"back\\slash"},"finish_reason":null}]}`,
		`{"id":"a","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`,
		`{"id":"a","choices":[{"index":0,"delta":{"content":"!"},"finish_reason":null,"index10":0}]}`,
	}
	tr := New(provider.Chat)
	for _, c := range chunks {
		tr.Add(provider.Event{Data: []byte(c)})
	}
	want := "He said \"hi\"\nspaced café tab\there back\\slash!"
	if tr.Text() != want || tr.Resumable() != nil {
		t.Errorf("expected %q, got %q (%v)", want, tr.Text(), tr.Resumable())
	}
	m := New(provider.Messages)
	for _, ev := range []string{
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"line\nand \"quote\" "}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\u00e9"}}`,
	} {
		m.Add(provider.Event{Data: []byte(ev)})
	}
	if m.Text() != "line\nand \"quote\" é" {
		t.Errorf("messages: got %q", m.Text())
	}
}

// A transcript keeps MaxText bytes at most: a longer answer is not
// resumed, and its text is let go.
func TestTranscriptIsBounded(t *testing.T) {
	tr := New(provider.Chat)
	tr.Add(provider.Event{Data: []byte(`{"id":"a","choices":[{"index":0,"delta":{"content":""}}]}`)})
	chunk := []byte(`{"id":"a","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 1000) + `"}}]}`)
	for range MaxText/1000 + 2 {
		tr.Add(provider.Event{Data: chunk})
	}
	if tr.Resumable() == nil || len(tr.Text()) != 0 {
		t.Errorf("expected an answer over MaxText not resumable and let go, kept %d bytes", len(tr.Text()))
	}
}

// A continuation's text is held (at most RestartProbe bytes) and compared
// with the start of the client's text before it is spliced: one that goes
// on is spliced as it is; one that begins again is spliced as a replay
// (what follows the client's text); one that repeats the start and then
// departs ends with ErrRestarted; one that shares fewer than restartHint
// bytes with the start is a continuation.
func TestAContinuationIsToldFromARestart(t *testing.T) {
	const had = "Crash testing a gateway means "
	chunk := func(text string) provider.Event {
		return provider.Event{Data: []byte(`{"id":"b","choices":[{"index":0,"delta":{"content":` + jsonString(text) + `}}]}`)}
	}
	finish := provider.Event{Data: []byte(`{"id":"b","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)}
	for _, tc := range []struct {
		name   string
		pieces []string
		want   string // what the client reads after had
		err    error
		heldTo int // pieces after which the first event is let through
	}{
		{"goes on", []string{" sending", " it faults."}, "sending it faults.", nil, 0},
		{"begins again", []string{"Crash testing a ", "gateway means sending", " it faults."}, "sending it faults.", nil, 1},
		{"begins again, short pieces", []string{"Crash", " test", "ing a", " gate", "way means", " sending"}, "sending", nil, 5},
		{"begins again and departs", []string{"Crash", " test", "s are fun."}, "", ErrRestarted, -1},
		{"shares under restartHint bytes", []string{"Cr", "ay"}, "Cray", nil, 1},
	} {
		tr := New(provider.Chat)
		tr.Add(chunk(had))
		_, s := tr.Prefix(provider.Usage{})
		var got strings.Builder
		var err error
		firstOut := -1
		for i, p := range append(tc.pieces, "") {
			ev := chunk(p)
			if i == len(tc.pieces) {
				ev = finish
			}
			var outs []provider.Event
			if outs, err = s.Event(ev); err != nil {
				break
			}
			for _, o := range outs {
				var c chatChunk
				_ = json.Unmarshal(o.Data, &c)
				if len(c.Choices) == 1 && c.Choices[0].Delta.Content != nil {
					got.WriteString(*c.Choices[0].Delta.Content)
					if firstOut < 0 {
						firstOut = i
					}
				}
			}
		}
		if !errors.Is(err, tc.err) || got.String() != tc.want || tc.err == nil && s.Owes() {
			t.Errorf("%s: expected %q (error %v), got %q (%v, owes %v)", tc.name, tc.want, tc.err, got.String(), err, s.Owes())
		}
		if firstOut != tc.heldTo {
			t.Errorf("%s: expected the first text let through at piece %d, got %d", tc.name, tc.heldTo, firstOut)
		}
		if tc.name == "begins again" && !s.Restarted() {
			t.Errorf("%s: expected Restarted", tc.name)
		}
	}
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

// A continuation that began again where no replay can take the place of
// the client's text (a Messages answer whose first block closed): it ends
// with ErrRestarted, and nothing of it reaches the client.
func TestARestartAfterAClosedBlockEnds(t *testing.T) {
	tr := New(provider.Messages)
	for _, ev := range []string{
		`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":5,"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Crash testing a gateway. "}}`,
		`{"type":"content_block_stop","index":0}`,
	} {
		tr.Add(provider.Event{Data: []byte(ev)})
	}
	_, s := tr.Prefix(provider.Usage{})
	var out []provider.Event
	var err error
	for _, ev := range []string{
		`{"type":"message_start","message":{"id":"n","usage":{"input_tokens":7,"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Crash testing a gateway. It"}}`,
	} {
		var got []provider.Event
		got, err = s.Event(provider.Event{Data: []byte(ev)})
		out = append(out, got...)
	}
	if !errors.Is(err, ErrRestarted) || len(out) != 0 {
		t.Errorf("expected ErrRestarted and nothing let through, got %v, %d events", err, len(out))
	}
}

// A probe holds maxHeld events at most: a continuation that sends only
// empty deltas is decided on the text it has (none: a continuation), and
// what it held is let go.
func TestAProbeHoldsBoundedEvents(t *testing.T) {
	tr := New(provider.Chat)
	tr.Add(provider.Event{Data: []byte(`{"id":"a","choices":[{"index":0,"delta":{"content":"Crash testing a gateway means"}}]}`)})
	_, s := tr.Prefix(provider.Usage{})
	empty := provider.Event{Data: []byte(`{"id":"b","choices":[{"index":0,"delta":{"content":""}}]}`)}
	for i := range maxHeld {
		if _, err := s.Event(empty); err != nil || s.Owes() != (i < maxHeld-1) {
			t.Fatalf("event %d: expected the probe held until %d events, got owes %v, %v", i, maxHeld, s.Owes(), err)
		}
	}
	if len(s.held) != 0 {
		t.Errorf("expected the held events let go, %d kept", len(s.held))
	}
}

// A chunk with no choice yet (an OpenAI-compatible server's opening
// filter results) tells nothing: the probe holds it and decides on the
// text that follows.
func TestAProbeWaitsPastAChunkWithoutChoices(t *testing.T) {
	tr := New(provider.Chat)
	tr.Add(provider.Event{Data: []byte(`{"id":"a","choices":[{"index":0,"delta":{"content":"Crash testing a gateway means "}}]}`)})
	_, s := tr.Prefix(provider.Usage{})
	var text strings.Builder
	for _, ev := range []string{
		`{"id":"b","choices":[],"prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}`,
		`{"id":"b","choices":[{"index":0,"delta":{"content":"Crash testing a gateway means sending"}}]}`,
	} {
		outs, err := s.Event(provider.Event{Data: []byte(ev)})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outs {
			var c chatChunk
			if json.Unmarshal(o.Data, &c) == nil && len(c.Choices) == 1 && c.Choices[0].Delta.Content != nil {
				text.WriteString(*c.Choices[0].Delta.Content)
			}
		}
	}
	if text.String() != "sending" || !s.Restarted() {
		t.Errorf("expected the answer begun again spliced as a replay (%q), got %q, restarted %v", "sending", text.String(), s.Restarted())
	}
}
