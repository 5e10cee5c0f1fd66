package responses

import (
	"bytes"
	"encoding/json"

	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
	"github.com/llmrouter/caddy-llm-router/provider"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// ChatEncoder turns a Chat Completions stream, chunk by chunk, into a
// Responses stream
// (https://platform.openai.com/docs/api-reference/responses-streaming):
// response.created and response.in_progress; for the text a message item
// (response.output_item.added, response.content_part.added,
// response.output_text.delta..., response.output_text.done,
// response.content_part.done, response.output_item.done); for each tool
// call a function_call item (response.output_item.added,
// response.function_call_arguments.delta..., .done,
// response.output_item.done); and response.completed (or
// response.incomplete) with the whole response and its usage, at Done.
// Every event carries its sequence_number. It is not safe for concurrent
// use; one per stream.
type ChatEncoder struct {
	seq      int
	started  bool
	finished bool
	resp     Response
	open     int // output index of the open item, -1 when none
	text     bytes.Buffer
	args     map[int]int // chat tool call index -> output index
	finish   string
	usage    *Usage
	echo     Echo // what the response restates of its request
}

// NewChatEncoder returns an encoder for one stream.
func NewChatEncoder() *ChatEncoder {
	return &ChatEncoder{open: -1, args: map[int]int{}}
}

// Restating sets what the stream's response restates of its request
// (Echo), before its first event; it returns e.
func (e *ChatEncoder) Restating(x Echo) *ChatEncoder {
	e.echo = x
	return e
}

// event frames one event: its type, and the sequence number added.
func (e *ChatEncoder) event(out []byte, typ string, v map[string]any) []byte {
	v["type"] = typ
	v["sequence_number"] = e.seq
	e.seq++
	data, _ := jsonbody.Marshal(v) // maps of plain values: cannot fail
	out = append(out, "event: "...)
	out = append(out, typ...)
	out = append(out, "\ndata: "...)
	out = append(out, data...)
	return append(out, "\n\n"...)
}

func (e *ChatEncoder) start(out []byte, model string) []byte {
	e.started = true
	e.resp = newResponse("", model, "in_progress")
	e.resp.restate(e.echo)
	e.resp.Usage = nil
	out = e.event(out, "response.created", map[string]any{"response": e.resp})
	return e.event(out, "response.in_progress", map[string]any{"response": e.resp})
}

// ID is the response's id once the stream began, "" before.
func (e *ChatEncoder) ID() string { return e.resp.ID }

// Chunk takes one chat.completion.chunk JSON and returns the Responses
// events it makes, framed as server-sent events, possibly none. A chunk
// that is not valid JSON, or comes after Done, makes none. Only the first
// choice is relayed: a response has one answer.
func (e *ChatEncoder) Chunk(data []byte) []byte {
	if e.finished {
		return nil
	}
	var c chat.Chunk
	if json.Unmarshal(data, &c) != nil {
		return nil
	}
	var out []byte
	if !e.started {
		out = e.start(out, c.Model)
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		if d := ch.Delta.Content; d != nil && *d != "" {
			out = e.textDelta(out, *d)
		}
		if d := ch.Delta.Refusal; d != nil && *d != "" {
			out = e.textDelta(out, *d)
		}
		for _, tc := range ch.Delta.ToolCalls {
			out = e.toolCall(out, tc)
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			out = e.closeItem(out)
			e.finish = *ch.FinishReason
		}
	}
	if c.Usage != nil {
		e.usage = usageFromChat(c.Usage)
	}
	return out
}

// textDelta relays a piece of text, opening the message item first.
func (e *ChatEncoder) textDelta(out []byte, d string) []byte {
	if e.open < 0 || e.resp.Output[e.open].Type != "message" {
		out = e.closeItem(out)
		e.open = len(e.resp.Output)
		it := messageItem(chat.NewID("msg_"), "", false, "in_progress")
		it.Content = []OutputPart{}
		e.resp.Output = append(e.resp.Output, it)
		e.text.Reset()
		out = e.event(out, "response.output_item.added", map[string]any{"output_index": e.open, "item": it})
		empty := ""
		out = e.event(out, "response.content_part.added", map[string]any{"item_id": it.ID, "output_index": e.open,
			"content_index": 0, "part": OutputPart{Type: "output_text", Text: &empty, Annotations: []json.RawMessage{}}})
	}
	e.text.WriteString(d)
	return e.event(out, "response.output_text.delta", map[string]any{"item_id": e.resp.Output[e.open].ID,
		"output_index": e.open, "content_index": 0, "delta": d, "logprobs": []any{}})
}

// toolCall opens a function_call item for a new call and relays its
// arguments.
func (e *ChatEncoder) toolCall(out []byte, tc chat.ToolCall) []byte {
	idx := 0
	switch {
	case tc.Index != nil:
		idx = *tc.Index
	case tc.ID != "" && (e.open < 0 || e.resp.Output[e.open].Type != "function_call" || e.resp.Output[e.open].CallID != tc.ID):
		// No index (some servers): a new id is a new call.
		idx = -1 - len(e.args)
	case e.open >= 0 && e.resp.Output[e.open].Type == "function_call":
		// No index, no id: more of the open call.
		for k, oi := range e.args {
			if oi == e.open {
				idx = k
			}
		}
	}
	oi, ok := e.args[idx]
	if !ok {
		out = e.closeItem(out)
		oi = len(e.resp.Output)
		e.args[idx] = oi
		e.open = oi
		callID := tc.ID
		if callID == "" {
			callID = chat.NewID("call_")
		}
		it := callItem(chat.NewID("fc_"), callID, tc.Function.Name, "", "in_progress")
		e.resp.Output = append(e.resp.Output, it)
		out = e.event(out, "response.output_item.added", map[string]any{"output_index": oi, "item": it})
	}
	it := &e.resp.Output[oi]
	if a := string(tc.Function.Arguments); a != "" {
		*it.Args += a
		out = e.event(out, "response.function_call_arguments.delta", map[string]any{"item_id": it.ID,
			"output_index": oi, "delta": a})
	}
	return out
}

// closeItem ends the open item, if any.
func (e *ChatEncoder) closeItem(out []byte) []byte {
	if e.open < 0 {
		return out
	}
	oi := e.open
	e.open = -1
	it := &e.resp.Output[oi]
	it.Status = "completed"
	switch it.Type {
	case "message":
		text := e.text.String()
		part := OutputPart{Type: "output_text", Text: &text, Annotations: []json.RawMessage{}}
		it.Content = []OutputPart{part}
		out = e.event(out, "response.output_text.done", map[string]any{"item_id": it.ID, "output_index": oi,
			"content_index": 0, "text": text, "logprobs": []any{}})
		out = e.event(out, "response.content_part.done", map[string]any{"item_id": it.ID, "output_index": oi,
			"content_index": 0, "part": part})
		e.resp.OutputText += text
	case "function_call":
		out = e.event(out, "response.function_call_arguments.done", map[string]any{"item_id": it.ID,
			"output_index": oi, "name": it.Name, "arguments": *it.Args})
	}
	return e.event(out, "response.output_item.done", map[string]any{"output_index": oi, "item": *it})
}

// Done returns the events that end a complete stream: the open item's end,
// and response.completed (response.incomplete when the answer was cut by
// max_output_tokens or a content filter) with the whole response.
func (e *ChatEncoder) Done() []byte {
	if e.finished {
		return nil
	}
	var out []byte
	if !e.started {
		out = e.start(out, "")
	}
	out = e.closeItem(out)
	e.finished = true
	st, inc := status(e.finish)
	e.resp.Status, e.resp.IncompleteDetails, e.resp.Usage = st, inc, e.usage
	typ := "response.completed"
	if st == "incomplete" {
		typ = "response.incomplete"
	}
	return e.event(out, typ, map[string]any{"response": e.resp})
}

// Failed returns the event that ends a stream that failed after it began:
// response.failed, the response's status failed and its error code and
// message; never a response.completed.
func (e *ChatEncoder) Failed(code, message string) []byte {
	if e.finished {
		return nil
	}
	var out []byte
	if !e.started {
		out = e.start(out, "")
	}
	e.finished = true
	if e.open >= 0 {
		// What was streamed of the open item, which did not end.
		it := &e.resp.Output[e.open]
		it.Status = "incomplete"
		if it.Type == "message" {
			text := e.text.String()
			it.Content = []OutputPart{{Type: "output_text", Text: &text}}
		}
	}
	e.resp.Status = "failed"
	e.resp.Error = &ErrorObject{Code: code, Message: message}
	e.resp.Usage = e.usage
	return e.event(out, "response.failed", map[string]any{"response": e.resp})
}

// FailedEvent is the response.failed event that ends a natively relayed
// stream which failed after it began, for the response id and model the
// provider's response.created named ("" for fresh ones): its events
// carried the sequence numbers up to next.
func FailedEvent(next int, id, model, code, message string) []byte {
	e := &ChatEncoder{seq: next, started: true, open: -1, resp: newResponse(id, model, "in_progress")}
	return e.Failed(code, message)
}

// Event is a Responses stream event as a decoder reads it.
type Event struct {
	Type           string          `json:"type"`
	SequenceNumber *int            `json:"sequence_number"`
	Delta          json.RawMessage `json:"delta"`
	Item           *struct {
		Type string `json:"type"`
	} `json:"item"`
	Response *struct {
		Status string       `json:"status"`
		Error  *ErrorObject `json:"error"`
	} `json:"response"`
	Code    json.RawMessage `json:"code"`
	Message string          `json:"message"`
}

// Decoder reads a provider's Responses stream for a native relay: it says
// what each event means to the router (content, the end, an in-band
// error) and relays the events as they came. response.completed and
// response.incomplete end the stream; response.failed and error are
// in-band errors, classified by onError from their code and message.
type Decoder struct {
	onError func(code, message string) provider.Observation
	next    int  // the sequence number after the last event relayed
	ended   bool // a completed or incomplete response arrived
}

// NewDecoder returns a decoder for one stream.
func NewDecoder(onError func(code, message string) provider.Observation) *Decoder {
	return &Decoder{onError: onError}
}

// Complete implements provider.EventDecoder.
func (d *Decoder) Complete() bool { return d.ended }

// Next returns the sequence number of the next event, for a
// response.failed the router writes after the provider's events.
func (d *Decoder) Next() int { return d.next }

// Decode implements provider.EventDecoder.
func (d *Decoder) Decode(ev *provider.Event) (provider.Event, provider.EventKind, provider.Observation) {
	none := provider.Observation{}
	data := bytes.TrimSpace(ev.Data)
	if len(data) == 0 {
		return provider.Event{}, provider.EventSkip, none
	}
	var e Event
	if json.Unmarshal(data, &e) != nil {
		o := provider.NewObservation(provider.Server)
		o.Message = "invalid JSON event in a Responses stream"
		return provider.Event{}, provider.EventError, o
	}
	typ := e.Type
	if typ == "" {
		typ = ev.Name
	}
	if e.SequenceNumber != nil {
		d.next = *e.SequenceNumber + 1
	}
	kind := provider.EventSkip
	switch typ {
	case "response.output_text.delta", "response.refusal.delta", "response.function_call_arguments.delta",
		"response.reasoning_summary_text.delta", "response.reasoning_text.delta":
		if s := jsonString(e.Delta); s != "" {
			kind = provider.EventData
		}
	case "response.output_item.added":
		if e.Item != nil && e.Item.Type != "message" && e.Item.Type != "reasoning" {
			kind = provider.EventData // a call begins
		}
	case "response.completed", "response.incomplete":
		d.ended = true
		return *ev, provider.EventDone, none
	case "response.failed":
		code, msg := "", "the response failed"
		if e.Response != nil && e.Response.Error != nil {
			code, msg = e.Response.Error.Code, e.Response.Error.Message
		}
		return provider.Event{}, provider.EventError, d.onError(code, msg)
	case "error":
		code := jsonString(e.Code)
		return provider.Event{}, provider.EventError, d.onError(code, e.Message)
	case "":
		o := provider.NewObservation(provider.Server)
		o.Message = "a Responses stream event without a type"
		return provider.Event{}, provider.EventError, o
	}
	return *ev, kind, none
}

// jsonString is raw's string value, "" when it is not a string.
func jsonString(raw json.RawMessage) string {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}
