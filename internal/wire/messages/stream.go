package messages

import (
	"bytes"
	"cmp"
	"encoding/json"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
	"github.com/llmrouter/caddy-llm-router/provider"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// ChatDecoder reads a Messages stream
// (https://docs.anthropic.com/en/docs/build-with-claude/streaming) for the
// router: it says what each event means (content, a finish, the end, an
// error) and relays either the event itself (a native pass, for a Messages
// client) or its translation into chat.completion.chunks.
//
// The role goes in the first chunk with content, not in one for
// message_start, so that an error right after message_start can still fail
// over: message_start is no first token. It is not safe for concurrent
// use; one per stream.
type ChatDecoder struct {
	native  bool
	onError func(ErrorDetail) provider.Observation
	w       chat.ChunkWriter
	usage   Usage
	tools   map[int]int // content block index -> tool_calls index
	nTools  int
	finals  int
}

// NewChatDecoder returns a decoder for one stream; native relays the
// events as they come instead of chunks. onError classifies an error
// event (the provider's dialect).
func NewChatDecoder(native bool, onError func(ErrorDetail) provider.Observation) *ChatDecoder {
	return &ChatDecoder{native: native, onError: onError, tools: map[int]int{}}
}

// Complete implements provider.EventDecoder: message_delta (the stop
// reason and usage) arrived.
func (d *ChatDecoder) Complete() bool { return d.finals > 0 }

// Decode implements provider.EventDecoder.
func (d *ChatDecoder) Decode(ev *provider.Event) (provider.Event, provider.EventKind, provider.Observation) {
	none := provider.Observation{}
	data := bytes.TrimSpace(ev.Data)
	if len(data) == 0 {
		return provider.Event{}, provider.EventSkip, none
	}
	var e Event
	if json.Unmarshal(data, &e) != nil {
		return provider.Event{}, provider.EventError, broken("invalid JSON event in stream")
	}
	typ := e.Type
	if typ == "" {
		typ = ev.Name
	}
	if typ == "" {
		return provider.Event{}, provider.EventError, broken("stream event without a type")
	}
	var chunk []byte
	kind := provider.EventSkip
	switch typ {
	case "message_start":
		if e.Message != nil {
			d.w.Start(e.Message.ID, e.Message.Model)
			d.usage = e.Message.Usage
		}
	case "content_block_start":
		kind, chunk = d.blockStart(&e)
	case "content_block_delta":
		kind, chunk = d.blockDelta(&e)
	case "message_delta":
		if e.Delta == nil {
			return provider.Event{}, provider.EventError, broken("message_delta without a delta")
		}
		kind = provider.EventFinal
		d.finals++
		if !d.native {
			u := d.usage
			var output int64
			if e.Usage != nil {
				output = e.Usage.OutputTokens
				// Newer API versions repeat the input counts here.
				u.InputTokens = max(u.InputTokens, e.Usage.InputTokens)
				u.CacheReadInputTokens = max(u.CacheReadInputTokens, e.Usage.CacheReadInputTokens)
				u.CacheCreationInputTokens = max(u.CacheCreationInputTokens, e.Usage.CacheCreationInputTokens)
				u.CacheCreation = cmp.Or(e.Usage.CacheCreation, u.CacheCreation)
			}
			chunk = d.w.Chunk(chat.Delta{}, FinishReason(e.Delta.StopReason), u.ChatUsage(output))
		}
	case "message_stop":
		kind = provider.EventDone
	case "error":
		var detail ErrorDetail
		if e.Error != nil {
			detail = *e.Error
		}
		return provider.Event{}, provider.EventError, d.onError(detail)
	}
	// ping, content_block_stop, and event types added later: skipped.
	if d.native && kind != provider.EventDone {
		return *ev, kind, none
	}
	return provider.Event{Data: chunk}, kind, none
}

// blockStart reads a content_block_start: a tool call begins (content), or
// text with a first piece.
func (d *ChatDecoder) blockStart(e *Event) (provider.EventKind, []byte) {
	cb := e.ContentBlock
	switch {
	case cb == nil:
	case cb.Type == "tool_use":
		i := d.nTools
		d.nTools++
		d.tools[index(e)] = i
		if d.native {
			return provider.EventData, nil
		}
		return provider.EventData, d.w.Chunk(chat.Delta{ToolCalls: []chat.ToolCall{{
			Index: &i, ID: cb.ID, Type: "function", Function: chat.FunctionCall{Name: cb.Name},
		}}}, "", nil)
	case cb.Type == "text" && cb.TextOf() != "":
		if d.native {
			return provider.EventData, nil
		}
		return provider.EventData, d.w.Chunk(chat.Delta{Content: cb.Text}, "", nil)
	}
	return provider.EventSkip, nil
}

// blockDelta reads a content_block_delta. An empty text, arguments or
// thinking piece is no first token. Thinking, signature and citations
// deltas are the model producing (a first token for ttft_timeout, and for
// a native relay) with nothing for a Chat Completions client.
func (d *ChatDecoder) blockDelta(e *Event) (provider.EventKind, []byte) {
	dl := e.Delta
	switch {
	case dl == nil,
		dl.Type == "text_delta" && dl.Text == "",
		dl.Type == "input_json_delta" && dl.PartialJSON == "",
		dl.Type == "thinking_delta" && dl.Thinking == "",
		dl.Type == "signature_delta" && dl.Signature == "":
		return provider.EventSkip, nil
	case d.native:
	case dl.Type == "text_delta":
		return provider.EventData, d.w.Chunk(chat.Delta{Content: &dl.Text}, "", nil)
	case dl.Type == "input_json_delta":
		i, ok := d.tools[index(e)]
		if !ok {
			return provider.EventData, nil // a server tool's input: progress, nothing to relay
		}
		return provider.EventData, d.w.Chunk(chat.Delta{ToolCalls: []chat.ToolCall{{
			Index: &i, Function: chat.FunctionCall{Arguments: chat.Arguments(dl.PartialJSON)},
		}}}, "", nil)
	}
	return provider.EventData, nil
}

func index(e *Event) int {
	if e.Index == nil {
		return 0
	}
	return *e.Index
}

// broken is a stream that is not a Messages stream.
func broken(msg string) provider.Observation {
	o := provider.NewObservation(provider.Server)
	o.Message = msg
	return o
}

// ChatEncoder turns a Chat Completions stream, chunk by chunk, into a
// Messages stream: message_start, then for each text run or tool call a
// content block (content_block_start, deltas, content_block_stop), then
// message_delta with the stop_reason and usage, and message_stop.
//
// A text block streams as its pieces come. A tool call's block is sent
// whole when the call ends (the next text, the finish_reason, or the end):
// content_block_start (its id mapped by ToolID), one input_json_delta with
// its arguments as an object (toolInput), content_block_stop. Arguments
// are the model's text and may not be JSON; the SDKs parse the deltas as
// they come (the Node SDK's stream helper throws on an invalid prefix), so
// they can only be made an object once whole. It is not safe for
// concurrent use; one per stream.
type ChatEncoder struct {
	// PromptTokens is what message_start's usage.input_tokens says: the
	// request's prompt estimate, in tokens (0 when unknown). A Chat stream
	// states its usage only at its end, which message_delta carries.
	PromptTokens int64

	started   bool
	deltaSent bool
	stopped   bool
	open      int                // index of the open content block, -1 when none
	openText  bool               // the open block is text (else tool_use)
	next      int                // index of the next content block
	tools     map[int]*toolBlock // by the Chat tool call index
	pending   []*toolBlock       // calls not yet sent, in order
	stop      string             // stop_reason once a finish_reason arrived
	usage     *Usage
}

// toolBlock is one tool call, gathered until it is sent.
type toolBlock struct {
	id, name string
	args     strings.Builder
}

// NewChatEncoder returns an encoder for one stream.
func NewChatEncoder() *ChatEncoder {
	return &ChatEncoder{open: -1, tools: map[int]*toolBlock{}}
}

// Chunk takes one chat.completion.chunk JSON and returns the Messages
// events it makes, framed as server-sent events, possibly none. A chunk
// that is not valid JSON, or arrives after the message ended, makes none.
// Only the first choice is relayed: a message has one answer.
func (e *ChatEncoder) Chunk(data []byte) []byte {
	if e.stopped {
		return nil
	}
	var c chat.Chunk
	if json.Unmarshal(data, &c) != nil {
		return nil
	}
	var out []byte
	if !e.started {
		out = e.messageStart(out, c.ID, c.Model)
	}
	if e.deltaSent {
		return out
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		if d := ch.Delta.Content; d != nil && *d != "" {
			out = e.text(out, *d)
		}
		if d := ch.Delta.Refusal; d != nil && *d != "" {
			out = e.text(out, *d)
		}
		for _, tc := range ch.Delta.ToolCalls {
			out = e.toolCall(out, tc)
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			out = e.closeBlock(out)
			e.stop = StopReason(*ch.FinishReason)
		}
	}
	if c.Usage != nil {
		u := usageFromChat(c.Usage)
		e.usage = &u
	}
	if e.stop != "" && e.usage != nil {
		out = e.messageDelta(out)
	}
	return out
}

// toolCall gathers a tool call: a new one (some providers reuse index 0
// for every call) or more arguments of one seen (even after another began:
// they go to their own call).
func (e *ChatEncoder) toolCall(out []byte, tc chat.ToolCall) []byte {
	idx := 0
	if tc.Index != nil {
		idx = *tc.Index
	}
	t, known := e.tools[idx]
	if !known || tc.ID != "" && tc.ID != t.id {
		out = e.closeText(out)
		t = &toolBlock{id: tc.ID, name: tc.Function.Name}
		e.tools[idx] = t
		e.pending = append(e.pending, t)
	}
	t.args.WriteString(string(tc.Function.Arguments))
	return out
}

// flushTools sends the gathered tool calls, each as a whole tool_use block.
func (e *ChatEncoder) flushTools(out []byte) []byte {
	for _, t := range e.pending {
		i := e.next
		e.next++
		out = appendEvent(out, Event{Type: "content_block_start", Index: &i,
			ContentBlock: &Block{Type: "tool_use", ID: callID(t.id), Name: t.name, Input: json.RawMessage("{}")}})
		out = appendEvent(out, Event{Type: "content_block_delta", Index: &i,
			Delta: &Delta{Type: "input_json_delta", PartialJSON: string(toolInput(t.args.String()))}})
		out = appendEvent(out, Event{Type: "content_block_stop", Index: &i})
	}
	e.pending = e.pending[:0]
	clear(e.tools)
	return out
}

// Done ends the stream: it closes an open block, sends message_delta if no
// usage came (stop_reason end_turn if no finish_reason came either), and
// message_stop. Only the first call returns events.
func (e *ChatEncoder) Done() []byte {
	if e.stopped {
		return nil
	}
	var out []byte
	if !e.started {
		out = e.messageStart(out, "", "")
	}
	out = e.closeBlock(out)
	if !e.deltaSent {
		if e.stop == "" {
			e.stop = "end_turn"
		}
		out = e.messageDelta(out)
	}
	e.stopped = true
	return appendEvent(out, Event{Type: "message_stop"})
}

func (e *ChatEncoder) messageStart(out []byte, id, model string) []byte {
	e.started = true
	return appendEvent(out, Event{Type: "message_start", Message: &Response{
		ID: messageID(id), Type: "message", Role: "assistant", Model: model, Content: []Block{},
		Usage: Usage{InputTokens: max(e.PromptTokens, 0)},
	}})
}

func (e *ChatEncoder) text(out []byte, s string) []byte {
	if e.open < 0 || !e.openText {
		out = e.closeBlock(out)
		e.open, e.openText = e.next, true
		e.next++
		out = appendEvent(out, Event{Type: "content_block_start", Index: &e.open, ContentBlock: &Block{Type: "text", Text: new(string)}})
	}
	return appendEvent(out, Event{Type: "content_block_delta", Index: &e.open, Delta: &Delta{Type: "text_delta", Text: s}})
}

// closeBlock ends the open text block, and sends the gathered tool calls.
func (e *ChatEncoder) closeBlock(out []byte) []byte {
	return e.flushTools(e.closeText(out))
}

// closeText ends the open text block.
func (e *ChatEncoder) closeText(out []byte) []byte {
	if e.open < 0 {
		return out
	}
	out = appendEvent(out, Event{Type: "content_block_stop", Index: &e.open})
	e.open = -1
	return out
}

func (e *ChatEncoder) messageDelta(out []byte) []byte {
	e.deltaSent = true
	u := Usage{}
	if e.usage != nil {
		u = *e.usage
	}
	// delta.stop_sequence is required (null: a Chat stream does not say
	// which stop sequence ended it).
	data, _ := jsonbody.Marshal(messageDelta{Type: "message_delta", Delta: stopDelta{StopReason: e.stop}, Usage: u}) // plain structs: cannot fail
	return provider.AppendEvent(out, "message_delta", data)
}

// messageDelta is the message_delta event the router writes.
type messageDelta struct {
	Type  string    `json:"type"`
	Delta stopDelta `json:"delta"`
	Usage Usage     `json:"usage"`
}

// stopDelta is message_delta's delta: both fields required, nullable.
type stopDelta struct {
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

// appendEvent appends ev as a server-sent event named by its type.
func appendEvent(out []byte, ev Event) []byte {
	data, _ := jsonbody.Marshal(ev) // plain structs: cannot fail
	return provider.AppendEvent(out, ev.Type, data)
}

// StreamError returns the event that ends a Messages stream that failed
// after it began: "event: error" with an error body.
func StreamError(typ, msg string) []byte {
	return provider.AppendEvent(nil, "error", NewError(typ, msg))
}
