// Package resume reads a streamed answer as its client received it, and
// splices into it the stream of another attempt that continues it, so
// that the client reads one answer: no repeated text, no gap, one
// message, one end, usage summed over the attempts.
//
// It reads the two formats a resumed stream can be in: Chat Completions
// chunks (provider.Chat: every translated stream, and an OpenAI-format
// provider's own) and Anthropic Messages events (provider.Messages: a
// Claude deployment's own stream for a Messages client). A stream in
// another format (a Responses or legacy completions stream passed on as
// the provider sent it) is never resumed.
//
// What can be continued is text: a stream that relayed a tool call (its
// arguments may be cut mid-JSON), reasoning, a refusal, or more than one
// choice is not resumed.
package resume

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// MaxText bounds the text a transcript keeps, in bytes (about 64k
// tokens): a longer answer is not resumed, so that each stream's memory
// stays bounded whatever its provider sends.
const MaxText = 256 << 10

// Transcript is what a client received of one streamed answer, read from
// the events relayed to it (Add), in the stream's format. It is not safe
// for concurrent use.
type Transcript struct {
	f    provider.Format
	text strings.Builder
	// why is set when the stream cannot be resumed: what it relayed that
	// no continuation can take up.
	why string
	// Chat: the first chunk's id, created and model, as JSON values,
	// which a continuation's chunks take on.
	id, created, model []byte
	// Messages: how many content blocks began, and whether the last one
	// is open (a text block without its content_block_stop).
	blocks int
	open   bool
	// finished: a choice's finish_reason or message_delta's stop_reason
	// was relayed: the answer is whole, nothing to continue.
	finished bool
}

// New returns the transcript of a stream in format f.
func New(f provider.Format) *Transcript {
	t := &Transcript{f: f}
	if f != provider.Chat && f != provider.Messages {
		t.why = "a " + f.String() + " stream passed on as the provider sent it cannot be resumed"
	}
	return t
}

// Text returns the answer's text the client has received.
func (t *Transcript) Text() string { return t.text.String() }

// Resumable returns nil when the answer so far can be continued by
// another attempt, else why not.
func (t *Transcript) Resumable() error {
	switch {
	case t.why != "":
		return errors.New(t.why)
	case t.text.Len() > MaxText:
		return errors.New("the answer is longer than a resume takes up")
	case t.finished:
		return errors.New("the answer had finished")
	}
	return nil
}

// CanReplay reports whether a replay (the request asked again from its
// start) can be spliced in: the client has one text block at most, still
// open, so that the replay's first block takes its place.
func (t *Transcript) CanReplay() bool {
	return t.Resumable() == nil && (t.f != provider.Messages || t.blocks <= 1 && (t.blocks == 0 || t.open))
}

// chatChunk is what a transcript reads of a chat.completion.chunk.
type chatChunk struct {
	ID      json.RawMessage `json:"id"`
	Created json.RawMessage `json:"created"`
	Model   json.RawMessage `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role             string          `json:"role"`
			Content          *string         `json:"content"`
			Refusal          *string         `json:"refusal"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
			FunctionCall     json.RawMessage `json:"function_call"`
			ReasoningContent *string         `json:"reasoning_content"`
			Reasoning        *string         `json:"reasoning"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage json.RawMessage `json:"usage"`
}

// messagesEvent is what a transcript reads of a Messages stream event.
type messagesEvent struct {
	Type         string `json:"type"`
	Index        *int   `json:"index"`
	ContentBlock *struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content_block"`
	Delta *struct {
		Type       string  `json:"type"`
		Text       string  `json:"text"`
		StopReason *string `json:"stop_reason"`
	} `json:"delta"`
	Message *struct {
		Usage json.RawMessage `json:"usage"`
	} `json:"message"`
	Usage json.RawMessage `json:"usage"`
}

// nonEmpty reports whether a JSON value states something: not absent,
// null, [], {} or "".
func nonEmpty(raw json.RawMessage) bool {
	v := bytes.TrimSpace(raw)
	return len(v) > 0 && !bytes.Equal(v, []byte("null")) && !bytes.Equal(v, []byte("[]")) &&
		!bytes.Equal(v, []byte("{}")) && !bytes.Equal(v, []byte(`""`))
}

func stated(s *string) bool { return s != nil && *s != "" }

// Add reads one event relayed to the client. The common event (a chunk
// or a text delta that only carries text) is read by a byte scan; any
// other is decoded.
func (t *Transcript) Add(ev provider.Event) {
	if t.why != "" || len(ev.Data) == 0 {
		return
	}
	if t.text.Len() > MaxText {
		t.why = "the answer is longer than a resume takes up"
		t.text = strings.Builder{} // its memory back
		return
	}
	if t.fast(ev.Data) {
		return
	}
	switch t.f {
	case provider.Chat:
		if chatDone(ev.Data) {
			return
		}
		var c chatChunk
		if json.Unmarshal(ev.Data, &c) != nil {
			// The client read it (an OpenAI-compatible server's own shape:
			// content as an array of parts): what it holds is unknown.
			t.why = "the answer holds a chunk the router does not read"
			return
		}
		if t.id == nil {
			t.id, t.created, t.model = bytes.Clone(c.ID), bytes.Clone(c.Created), bytes.Clone(c.Model)
		}
		for _, ch := range c.Choices {
			d := &ch.Delta
			switch {
			case ch.Index != 0:
				t.why = "the answer has more than one choice"
			case nonEmpty(d.ToolCalls) || nonEmpty(d.FunctionCall):
				t.why = "the answer holds a tool call"
			case stated(d.ReasoningContent) || stated(d.Reasoning):
				t.why = "the answer holds reasoning"
			case stated(d.Refusal):
				t.why = "the answer is a refusal"
			case otherContent(ev.Data):
				t.why = "the answer holds content other than text"
			}
			if d.Content != nil {
				t.text.WriteString(*d.Content)
			}
			if stated(ch.FinishReason) {
				t.finished = true
			}
		}
	case provider.Messages:
		var e messagesEvent
		if json.Unmarshal(ev.Data, &e) != nil {
			t.why = "the answer holds an event the router does not read"
			return
		}
		switch e.Type {
		case "content_block_start":
			t.blocks++
			if e.ContentBlock == nil || e.ContentBlock.Type != "text" {
				t.why = "the answer holds a content block other than text"
				return
			}
			t.open = true
			t.text.WriteString(e.ContentBlock.Text)
		case "content_block_delta":
			if e.Delta == nil || e.Delta.Type != "text_delta" {
				t.why = "the answer holds content other than text"
				return
			}
			t.text.WriteString(e.Delta.Text)
		case "content_block_stop":
			t.open = false
		case "message_delta":
			if e.Delta != nil && stated(e.Delta.StopReason) {
				t.finished = true
			}
		}
	}
}

// ErrDiverged is returned by Splice.Event when a replay's text departs
// from what the client already has: it cannot be spliced in.
var ErrDiverged = errors.New("the new answer does not begin with the text the client already has")

// Splice rewrites the events of a stream that takes up an answer where its
// transcript left off, in the transcript's format, for the same client.
// Each event it lets through is read by the transcript too, so that a
// second break can be resumed as the first.
type Splice struct {
	t *Transcript
	// skip is the text the client has that the new stream may repeat at
	// its start: with strict, all of it must be there (a replay); else
	// what matches is dropped (the whitespace a continuation's prefix
	// left off).
	skip   string
	strict bool
	// prior is what the earlier attempts used, added to the usage the new
	// stream states, so that the client reads the sum.
	prior provider.Usage
	// Messages: the new stream's block i is the client's block base+i;
	// join drops the new stream's first block start, which continues the
	// client's open block.
	base int
	join bool
	// input is what the new stream's message_start said of its input.
	input provider.Usage
	// probe: a continuation's answer not yet told apart from one that
	// starts the answer again (see RestartProbe): its events are held,
	// and its text gathered in heard, until the text departs from the
	// client's or repeats enough of it. replayable: a restart can take the
	// place of the client's text (CanReplay); restarted: one did.
	probe, replayable, restarted bool
	held                         []provider.Event
	heard                        []byte
}

// RestartProbe is how much of a continuation's text, in bytes (about 4
// tokens), is held back and compared with the start of the client's text
// before any of it is spliced in. Some providers accept a continuation
// and ignore it: they answer from the beginning, and sampling makes that
// answer depart from the client's text after a few tokens unless
// temperature is 0. A continuation whose text
//   - begins with the client's first RestartProbe bytes (all of the
//     client's text when it is shorter) began again: it is spliced as a
//     replay (only what follows the client's text reaches the client; a
//     departure from that text ends the stream, ErrDiverged);
//   - departs from the client's text, or ends, after repeating at least
//     restartHint bytes of its start can be neither matched nor told
//     apart from a continuation: ErrRestarted, the stream ends in-band;
//   - departs within its first restartHint bytes (it does not begin as
//     the client's text does) is a continuation, spliced as it is.
//
// A continuation that legitimately begins as the answer it continues
// began is thus ended (in-band), not misspliced, unless the client's text
// is shorter than RestartProbe and the continuation repeats all of it.
// The events held wait for at most RestartProbe bytes of text (or maxHeld
// events): the client's stream is silent no longer than that takes.
const RestartProbe = 16

// restartHint is the shortest repeat of the client's text's start that
// tells a restart (see RestartProbe); maxHeld bounds the events a probe
// holds (empty deltas, pings) before it decides on the text it has.
const (
	restartHint = 4
	maxHeld     = 64
)

// ErrRestarted is returned by Splice.Event when a continuation's text
// began the answer again (it repeats the start of the client's text) and
// cannot be spliced in as a replay: it departed from the client's text,
// or the client's text spans more than the one block a replay takes the
// place of (see RestartProbe).
var ErrRestarted = errors.New("the continuation began the answer again instead of going on from the text the client already has")

// Prefix returns the text a continuation's request ends with (the
// assistant's, for the provider to continue) and the splice of its
// stream: the text the client has, without its trailing whitespace
// (providers refuse a prefill that ends in whitespace), which a
// continuation's text then likely begins with and the splice drops.
// prior is what the earlier attempts used.
func (t *Transcript) Prefix(prior provider.Usage) (string, *Splice) {
	text := t.Text()
	trimmed := strings.TrimRightFunc(text, unicode.IsSpace)
	s := &Splice{t: t, skip: text[len(trimmed):], prior: prior, probe: true, replayable: t.CanReplay()}
	s.base, s.join = t.blocks, false
	if t.open {
		s.base, s.join = t.blocks-1, true
	}
	return trimmed, s
}

// Replay returns the splice of a replay: the request asked again from its
// start, whose new text must begin with exactly the text the client has
// (CanReplay must be true).
func (t *Transcript) Replay(prior provider.Usage) *Splice {
	return &Splice{t: t, skip: t.Text(), strict: true, prior: prior, base: 0, join: t.blocks == 1}
}

// Event returns what the client is to receive of ev, an event of the new
// stream (as its plan relays it): ev rewritten, nothing (the new
// stream's start, text the client has, a continuation's start held until
// it is told apart from a restart: see RestartProbe), or the events held
// until ev. err is ErrDiverged when a replay's text departs from the
// client's, ErrRestarted when a continuation's began again and cannot be
// spliced as a replay; the events returned with it go to the client first.
func (s *Splice) Event(ev provider.Event) ([]provider.Event, error) {
	if len(ev.Data) == 0 {
		return nil, nil
	}
	if s.probe {
		text, plain := s.textOf(ev)
		s.held = append(s.held, provider.Event{Name: ev.Name, Data: bytes.Clone(ev.Data)})
		s.heard = append(s.heard, text...)
		return s.decide(!plain || len(s.held) >= maxHeld)
	}
	out, ok, err := s.event(ev)
	if !ok {
		return nil, err
	}
	return []provider.Event{out}, err
}

// End returns what the splice still holds when the new stream ended:
// a continuation's events not yet told apart (decided on the text they
// have). Owes then says whether the client's text is still owed.
func (s *Splice) End() ([]provider.Event, error) {
	if !s.probe {
		return nil, nil
	}
	return s.decide(true)
}

// Restarted reports whether a continuation's answer began again and was
// spliced as a replay.
func (s *Splice) Restarted() bool { return s.restarted }

// decide tells a probed continuation from a restart on the text heard so
// far (final: no more will be heard before it must decide), and lets the
// held events through as the one or the other; nothing while it cannot
// tell yet.
func (s *Splice) decide(final bool) ([]provider.Event, error) {
	had := s.t.Text()
	c, n := commonPrefix(s.heard, had), min(len(had), RestartProbe)
	restart := c >= n
	if !restart && c == len(s.heard) && !final {
		return nil, nil // what it said so far is how the client's text begins
	}
	held := s.held
	s.probe, s.held, s.heard = false, nil, nil
	switch {
	case restart && !s.replayable:
		return nil, ErrRestarted // the client's text is more than the one block a replay takes the place of
	case restart:
		s.skip, s.strict, s.restarted, s.base, s.join = had, true, true, 0, s.t.blocks == 1
	case c >= min(n, restartHint):
		return nil, ErrRestarted
	}
	var out []provider.Event
	for _, ev := range held {
		o, ok, err := s.event(ev)
		if ok {
			out = append(out, o)
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// commonPrefix returns how many bytes a and b begin with alike.
func commonPrefix(a []byte, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// textOf returns the text ev, an event of a probed continuation, adds to
// the answer's first block, and whether ev holds nothing else (a role, a
// start, a ping): what lets the probe go on. A finish, usage, a tool call,
// reasoning or an event it does not read end the probe.
func (s *Splice) textOf(ev provider.Event) (string, bool) {
	switch s.t.f {
	case provider.Chat:
		var c chatChunk
		switch {
		case json.Unmarshal(ev.Data, &c) != nil || len(c.Choices) > 1 || nonEmpty(c.Usage) || otherContent(ev.Data):
			return "", false
		case len(c.Choices) == 0:
			return "", true // no choice yet (a server's opening chunk of filter results)
		}
		ch := &c.Choices[0]
		d := &ch.Delta
		switch {
		case ch.Index != 0 || stated(ch.FinishReason) || nonEmpty(d.ToolCalls) || nonEmpty(d.FunctionCall) ||
			stated(d.ReasoningContent) || stated(d.Reasoning) || stated(d.Refusal):
			return "", false
		case d.Content == nil:
			return "", true
		}
		return *d.Content, true
	case provider.Messages:
		var e messagesEvent
		if json.Unmarshal(ev.Data, &e) != nil {
			return "", false
		}
		first := e.Index != nil && *e.Index == 0
		switch {
		case e.Type == "message_start", e.Type == "ping":
			return "", true
		case e.Type == "content_block_start" && first && e.ContentBlock != nil && e.ContentBlock.Type == "text":
			return e.ContentBlock.Text, true
		case e.Type == "content_block_delta" && first && e.Delta != nil && e.Delta.Type == "text_delta":
			return e.Delta.Text, true
		}
	}
	return "", false
}

// event rewrites one event of the new stream for the client (see Event);
// ok false when it is dropped.
func (s *Splice) event(ev provider.Event) (out provider.Event, ok bool, err error) {
	switch s.t.f {
	case provider.Chat:
		out, ok, err = s.chat(ev)
	case provider.Messages:
		out, ok, err = s.messages(ev)
	default:
		return ev, false, errors.New("not a resumable format")
	}
	if ok {
		s.t.Add(out)
	}
	return out, ok, err
}

// take drops what of text the client has (skip) and returns the rest;
// diverged when a replay's text departs from it.
func (s *Splice) take(text string) (rest string, diverged bool) {
	if s.skip == "" {
		return text, false
	}
	n := min(len(text), len(s.skip))
	if text[:n] == s.skip[:n] {
		s.skip = s.skip[n:]
		return text[n:], false
	}
	if s.strict {
		return "", true
	}
	// A continuation that did not repeat the whitespace: it stands as it is.
	s.skip = ""
	return text, false
}

func (s *Splice) chat(ev provider.Event) (provider.Event, bool, error) {
	var c chatChunk
	if json.Unmarshal(ev.Data, &c) != nil {
		if s.skip != "" || chatDone(ev.Data) {
			return ev, false, ErrDiverged // what it holds cannot be compared with the client's text
		}
		return ev, true, nil // not a chunk the router reads: passed on as it came
	}
	for _, ch := range c.Choices {
		d := &ch.Delta
		switch {
		case ch.Index != 0, stated(d.ReasoningContent), stated(d.Reasoning), stated(d.Refusal), otherContent(ev.Data):
			// Another choice, reasoning or a refusal, or content of another
			// kind, after the client's text: not one answer.
			return ev, false, ErrDiverged
		case s.skip != "" && s.strict && (nonEmpty(d.ToolCalls) || nonEmpty(d.FunctionCall)):
			return ev, false, ErrDiverged
		}
	}
	data := ev.Data
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return ev, true, nil
	}
	changed, reworded := false, false
	content, drop := "", false
	if len(c.Choices) == 1 {
		ch := &c.Choices[0]
		d := &ch.Delta
		if d.Content != nil {
			rest, diverged := s.take(*d.Content)
			if diverged {
				return ev, false, ErrDiverged
			}
			if rest != *d.Content {
				content, changed, reworded = rest, true, true
			}
		}
		if s.strict && s.skip != "" && stated(ch.FinishReason) {
			return ev, false, ErrDiverged // the new answer ended within the old one
		}
		empty := d.Content == nil || *d.Content == "" || changed && content == ""
		if empty && !stated(ch.FinishReason) && !nonEmpty(d.ToolCalls) && !nonEmpty(d.FunctionCall) &&
			!stated(d.ReasoningContent) && !stated(d.Reasoning) && !stated(d.Refusal) && !nonEmpty(c.Usage) {
			drop = true // a role, or text the client has
		}
	}
	if drop {
		return ev, false, nil
	}
	if len(c.Choices) == 1 && c.Choices[0].Delta.Role != "" {
		changed = true // the client has its role: not said again
	}
	if changed {
		var choices []map[string]json.RawMessage
		var delta map[string]json.RawMessage
		if json.Unmarshal(m["choices"], &choices) != nil || len(choices) != 1 || json.Unmarshal(choices[0]["delta"], &delta) != nil {
			return ev, true, nil
		}
		if reworded {
			delta["content"], _ = json.Marshal(content)
		}
		delete(delta, "role")
		choices[0]["delta"], _ = json.Marshal(delta)
		m["choices"], _ = json.Marshal(choices)
	}
	for key, v := range map[string][]byte{"id": s.t.id, "created": s.t.created, "model": s.t.model} {
		if v != nil {
			if _, has := m[key]; has {
				m[key], changed = v, true
			}
		}
	}
	if nonEmpty(c.Usage) && s.prior != (provider.Usage{}) {
		if u, ok := addChatUsage(c.Usage, s.prior); ok {
			m["usage"], changed = u, true
		}
	}
	if !changed {
		return ev, true, nil
	}
	out, err := json.Marshal(m)
	if err != nil {
		return ev, true, nil
	}
	return provider.Event{Name: ev.Name, Data: out}, true, nil
}

// addChatUsage returns a Chat Completions usage object with prior added.
func addChatUsage(raw json.RawMessage, prior provider.Usage) (json.RawMessage, bool) {
	var u map[string]json.RawMessage
	if json.Unmarshal(raw, &u) != nil {
		return nil, false
	}
	add(u, "prompt_tokens", prior.InputTokens)
	add(u, "completion_tokens", prior.OutputTokens)
	add(u, "total_tokens", prior.Total())
	if d, ok := u["prompt_tokens_details"]; ok && (prior.CachedInputTokens > 0 || prior.CacheWriteTokens > 0) {
		var details map[string]json.RawMessage
		if json.Unmarshal(d, &details) == nil && details != nil {
			add(details, "cached_tokens", prior.CachedInputTokens)
			if prior.CacheWriteTokens > 0 {
				add(details, "cache_write_tokens", prior.CacheWriteTokens)
			}
			u["prompt_tokens_details"], _ = json.Marshal(details)
		}
	}
	out, err := json.Marshal(u)
	return out, err == nil
}

// add adds n to the count at key of m (absent counts as 0).
func add(m map[string]json.RawMessage, key string, n int64) {
	var v int64
	if raw, ok := m[key]; ok {
		if json.Unmarshal(raw, &v) != nil {
			return // not a count: left as it is
		}
	}
	m[key] = strconv.AppendInt(nil, min(v, provider.MaxTokens)+n, 10)
}

func (s *Splice) messages(ev provider.Event) (provider.Event, bool, error) {
	var e messagesEvent
	if json.Unmarshal(ev.Data, &e) != nil {
		return ev, true, nil
	}
	data := ev.Data
	index := -1
	if e.Index != nil {
		index = *e.Index
	}
	reindex := func() {
		if index >= 0 && s.base != 0 {
			if out, err := jsonbody.SetRaw(data, "index", strconv.AppendInt(nil, int64(index+s.base), 10)); err == nil {
				data = out
			}
		}
	}
	switch e.Type {
	case "message_start":
		if e.Message != nil && nonEmpty(e.Message.Usage) {
			provider.AddMessagesUsage(&s.input, e.Message.Usage)
		}
		return ev, false, nil // the client has its message
	case "content_block_start":
		if index == 0 && s.join {
			if e.ContentBlock == nil || e.ContentBlock.Type != "text" {
				// Not text to go on with in the client's open block.
				return ev, false, ErrDiverged
			}
			return ev, false, nil // its text goes on in the client's open block
		}
		if s.strict && s.skip != "" {
			return ev, false, ErrDiverged
		}
		reindex()
	case "content_block_delta":
		if index == 0 && e.Delta != nil && e.Delta.Type == "text_delta" && s.skip != "" {
			rest, diverged := s.take(e.Delta.Text)
			if diverged {
				return ev, false, ErrDiverged
			}
			if rest == "" {
				return ev, false, nil
			}
			if rest != e.Delta.Text {
				delta, _ := json.Marshal(map[string]string{"type": "text_delta", "text": rest})
				if out, err := jsonbody.SetRaw(data, "delta", delta); err == nil {
					data = out
				}
			}
		} else if s.strict && s.skip != "" {
			return ev, false, ErrDiverged
		}
		reindex()
	case "content_block_stop":
		if s.strict && s.skip != "" {
			return ev, false, ErrDiverged
		}
		reindex()
	case "message_delta":
		if s.strict && s.skip != "" {
			return ev, false, ErrDiverged
		}
		if s.prior != (provider.Usage{}) || s.input != (provider.Usage{}) {
			if u, ok := s.messagesUsage(e.Usage); ok {
				if out, err := jsonbody.SetRaw(data, "usage", u); err == nil {
					data = out
				}
			}
		}
	}
	if len(data) == len(ev.Data) && bytes.Equal(data, ev.Data) {
		return ev, true, nil
	}
	return provider.Event{Name: ev.Name, Data: data}, true, nil
}

// messagesUsage returns message_delta's usage with the earlier attempts'
// and the new stream's input stated in it: an SDK takes the counts a
// message_delta states over message_start's, so that the client reads the
// sum of every attempt.
func (s *Splice) messagesUsage(raw json.RawMessage) (json.RawMessage, bool) {
	u := map[string]json.RawMessage{}
	if nonEmpty(raw) && json.Unmarshal(raw, &u) != nil {
		return nil, false
	}
	in := s.input
	if nonEmpty(raw) {
		provider.AddMessagesUsage(&in, raw)
	}
	var out int64
	if v, ok := u["output_tokens"]; ok {
		_ = json.Unmarshal(v, &out)
	}
	p := s.prior
	set := func(key string, n int64) { u[key] = strconv.AppendInt(nil, max(n, 0), 10) }
	set("output_tokens", min(out, provider.MaxTokens)+p.OutputTokens)
	set("input_tokens", in.InputTokens-in.CachedInputTokens-in.CacheWriteTokens+p.InputTokens-p.CachedInputTokens-p.CacheWriteTokens)
	set("cache_read_input_tokens", in.CachedInputTokens+p.CachedInputTokens)
	set("cache_creation_input_tokens", in.CacheWriteTokens+p.CacheWriteTokens)
	b, err := json.Marshal(u)
	return b, err == nil
}

// fast reads an event that only carries text (the body of a stream) with
// one scan of its members, and reports whether it did; false sends it to
// the decoding path (a first chunk, a finish, a tool call, reasoning, a
// key it does not know).
func (t *Transcript) fast(data []byte) bool {
	var raw []byte // the text's JSON string
	var ok bool
	switch t.f {
	case provider.Chat:
		raw, ok = t.fastChat(data)
	case provider.Messages:
		raw, ok = fastMessages(data)
	}
	if !ok {
		return false
	}
	if raw == nil {
		return true // no text: an empty delta, usage
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		if !utf8.Valid(raw) {
			return false // decoding reads U+FFFD, as the client does
		}
		t.text.Write(raw[1 : len(raw)-1])
		return true
	}
	str, ok := jsonbody.String(raw)
	if !ok {
		return false
	}
	t.text.WriteString(str)
	return true
}

// fastChat is fast for a Chat chunk: the JSON string of its one choice's
// delta content (nil: none), and whether the chunk carries nothing else
// (an index 0, no finish, no tool call, refusal or reasoning). The first
// chunk's id, created and model are kept, as the client read them.
func (t *Transcript) fastChat(data []byte) (raw []byte, ok bool) {
	ok = true
	if t.id == nil {
		// The first chunk: its id, created and model, as the client read them.
		id, created, model := member(data, "id"), member(data, "created"), member(data, "model")
		if id == nil {
			return nil, false
		}
		t.id, t.created, t.model = bytes.Clone(id), bytes.Clone(created), bytes.Clone(model)
	}
	start, end, err := jsonbody.FindMember(data, "choices")
	if err != nil || start < 0 {
		return nil, false
	}
	choices, n := data[start:end], 0
	err = jsonbody.EachElement(choices, func(s, e int) bool {
		if n++; n > 1 {
			ok = false
			return false
		}
		choice := choices[s:e]
		return jsonbody.EachMember(choice, func(k []byte, vs, ve int) bool {
			v := choice[vs:ve]
			switch string(k) {
			case "index":
				ok = string(v) == "0"
			case "finish_reason", "stop_reason", "native_finish_reason":
				ok = null(v)
			case "logprobs":
			case "delta":
				ok = jsonbody.EachMember(v, func(k []byte, ds, de int) bool {
					dv := v[ds:de]
					switch string(k) {
					case "content":
						if dv[0] == '"' {
							raw = dv
						} else {
							ok = null(dv)
						}
					case "role":
					case "tool_calls", "refusal", "reasoning", "reasoning_content", "function_call":
						ok = null(dv) || string(dv) == "[]"
					default:
						ok = false
					}
					return ok
				}) == nil && ok
			default:
				ok = false
			}
			return ok
		}) == nil && ok
	})
	if err != nil || !ok {
		return nil, false
	}
	return raw, true
}

// fastMessages is fast for a Messages event: the JSON string of a
// content_block_delta's text_delta, and whether the event is one with
// nothing else.
func fastMessages(data []byte) (raw []byte, ok bool) {
	if !bytes.Contains(data, textDelta) {
		return nil, false
	}
	ok = true
	err := jsonbody.EachMember(data, func(k []byte, vs, ve int) bool {
		v := data[vs:ve]
		switch string(k) {
		case "type":
			ok = string(v) == `"content_block_delta"`
		case "index":
		case "delta":
			typed := false
			ok = jsonbody.EachMember(v, func(k []byte, ds, de int) bool {
				dv := v[ds:de]
				switch string(k) {
				case "type":
					typed = string(dv) == `"text_delta"`
					ok = typed
				case "text":
					if ok = dv[0] == '"'; ok {
						raw = dv
					}
				default:
					ok = false
				}
				return ok
			}) == nil && ok && typed
		default:
			ok = false
		}
		return ok
	})
	if err != nil || !ok || raw == nil {
		return nil, false
	}
	return raw, true
}

// null reports whether a JSON value is null or an empty string.
// chatDone reports whether a Chat stream's event is its terminator, [DONE].
func chatDone(data []byte) bool { return bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) }

func null(v []byte) bool { return string(v) == "null" || string(v) == `""` }

var textDelta = []byte(`"text_delta"`)

// knownDelta are the members of a chat chunk's delta a transcript reads.
var knownDelta = map[string]bool{"role": true, "content": true, "tool_calls": true, "function_call": true,
	"refusal": true, "reasoning": true, "reasoning_content": true}

// otherContent reports whether a chunk's delta holds a member with a value
// that a transcript does not read (audio, annotations, a server's own):
// content of a kind no continuation takes up.
func otherContent(data []byte) bool {
	var c struct {
		Choices []struct {
			Delta map[string]json.RawMessage `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &c) != nil {
		return true
	}
	for _, ch := range c.Choices {
		for k, v := range ch.Delta {
			if !knownDelta[k] && nonEmpty(v) {
				return true
			}
		}
	}
	return false
}

// Owes reports whether a replay has not yet given all of the text the
// client has (its end now would leave the client's text unconfirmed), or
// a continuation is not yet told apart from one (End tells).
func (s *Splice) Owes() bool { return s.probe || s.strict && s.skip != "" }

// member returns the JSON value of data's top-level member key, nil when
// absent.
func member(data []byte, key string) []byte {
	start, end, err := jsonbody.FindMember(data, key)
	if err != nil || start < 0 {
		return nil
	}
	return data[start:end]
}
