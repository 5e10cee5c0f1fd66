package provider

import (
	"bytes"
	"encoding/json"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// Usage is what one answer used, in tokens, as its provider counted it.
type Usage struct {
	// InputTokens counts every input token: those read from the prompt
	// cache and those written to it too.
	InputTokens int64 `json:"input_tokens"`
	// CachedInputTokens are the input tokens read from the provider's
	// prompt cache (OpenAI's cached_tokens, Anthropic's
	// cache_read_input_tokens, Bedrock's cacheReadInputTokens, Gemini's
	// cachedContentTokenCount); CacheWriteTokens those written to it
	// (Anthropic's cache_creation_input_tokens, Bedrock's
	// cacheWriteInputTokens, a Chat usage's
	// prompt_tokens_details.cache_write_tokens). Both are part of
	// InputTokens.
	CachedInputTokens int64 `json:"cached_input_tokens"`
	CacheWriteTokens  int64 `json:"cache_write_tokens"`
	// CacheWrite1hTokens are the part of CacheWriteTokens written to the
	// one-hour cache, where the provider says (Anthropic's
	// cache_creation.ephemeral_1h_input_tokens, Bedrock's cacheDetails
	// entry of ttl "1h"); the rest were written to the 5-minute cache,
	// Anthropic's default.
	CacheWrite1hTokens int64 `json:"cache_write_1h_tokens"`
	// OutputTokens counts every output token, reasoning included;
	// ReasoningTokens those the model reasoned with (OpenAI's
	// reasoning_tokens), where the provider says.
	OutputTokens    int64 `json:"output_tokens"`
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// Total is input plus output tokens.
func (u Usage) Total() int64 { return u.InputTokens + u.OutputTokens }

// The usage objects of the formats, as their answers and stream events
// carry them: Chat Completions, legacy completions and embeddings
// ("usage": prompt_tokens...), Messages (input_tokens, cache_*), Responses
// (input_tokens, *_details).
type wireUsage struct {
	// Chat Completions, completions, embeddings
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    int64  `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens     int64 `json:"cached_tokens"`
		CacheWriteTokens int64 `json:"cache_write_tokens"` // OpenRouter's name, and the router's translations'
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
	// Messages, Responses
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheReadInputTokens     int64  `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int64  `json:"cache_creation_input_tokens"`
	// CacheCreation splits the cache writes by lifetime (Messages; a
	// translated Chat usage keeps it under the same name).
	CacheCreation *struct {
		Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
		Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

// MaxTokens bounds one answer's count of any kind: a provider's garbage
// (a count near the int64 limit) neither overflows the totals nor turns
// a cost negative.
const MaxTokens = 1 << 40

// count is a stated count within 0..MaxTokens.
func count(n int64) int64 { return min(max(n, 0), MaxTokens) }

func nonNeg(p *int64) int64 {
	if p == nil {
		return 0
	}
	return count(*p)
}

// empty reports whether the object states no count at all ("usage":{}).
func (w *wireUsage) empty() bool {
	return w.PromptTokens == nil && w.CompletionTokens == 0 && w.InputTokens == nil && w.OutputTokens == nil &&
		w.CacheReadInputTokens == 0 && w.CacheCreationInputTokens == 0 && w.CacheCreation == nil
}

// writes returns the cache writes the object states: all of them (the
// larger of the total and the sum of the lifetimes), and those of the
// one-hour lifetime (at most all).
func (w *wireUsage) writes(total int64) (all, oneHour int64) {
	all = count(total)
	if c := w.CacheCreation; c != nil {
		oneHour = count(c.Ephemeral1h)
		all = max(all, min(count(c.Ephemeral5m)+oneHour, MaxTokens))
	}
	return all, min(oneHour, all)
}

// into reads a usage object of format f into u: only what it states (a
// Messages stream's message_delta states output alone, or restates the
// input: never less than message_start said).
func (w *wireUsage) into(f Format, u *Usage) {
	switch f {
	case Messages:
		if w.InputTokens != nil || w.CacheReadInputTokens != 0 || w.CacheCreationInputTokens != 0 || w.CacheCreation != nil {
			read := count(w.CacheReadInputTokens)
			write, write1h := w.writes(w.CacheCreationInputTokens)
			u.CachedInputTokens, u.CacheWriteTokens = max(u.CachedInputTokens, read), max(u.CacheWriteTokens, write)
			u.CacheWrite1hTokens = max(u.CacheWrite1hTokens, write1h)
			u.InputTokens = max(u.InputTokens, nonNeg(w.InputTokens)+u.CachedInputTokens+u.CacheWriteTokens)
		}
		if w.OutputTokens != nil {
			u.OutputTokens = nonNeg(w.OutputTokens)
		}
	case Responses:
		u.InputTokens, u.OutputTokens = nonNeg(w.InputTokens), nonNeg(w.OutputTokens)
		if w.InputTokensDetails != nil {
			u.CachedInputTokens = count(w.InputTokensDetails.CachedTokens)
		}
		if w.OutputTokensDetails != nil {
			u.ReasoningTokens = count(w.OutputTokensDetails.ReasoningTokens)
		}
	default:
		u.InputTokens, u.OutputTokens = nonNeg(w.PromptTokens), count(w.CompletionTokens)
		var write int64
		if w.PromptTokensDetails != nil {
			u.CachedInputTokens = count(w.PromptTokensDetails.CachedTokens)
			write = w.PromptTokensDetails.CacheWriteTokens
		}
		u.CacheWriteTokens, u.CacheWrite1hTokens = w.writes(write)
		if w.CompletionTokensDetails != nil {
			u.ReasoningTokens = count(w.CompletionTokensDetails.ReasoningTokens)
		}
	}
}

// UsageOf reads the usage of a whole answer (a non-streamed body) in
// format f; ok is false when it states none. The body's top-level "usage"
// member is decoded as encoding/json decodes it into a struct (its key in
// any case or escaped; a repeated one merged into the first, a later null
// ending it) and nothing else of the body: the rest is scanned, not
// decoded nor validated (the router passes the answer on as it is), so
// that the usage of a long answer costs a scan of its top level.
func UsageOf(f Format, body []byte) (u Usage, ok bool) {
	var w *wireUsage
	bad := false
	err := jsonbody.EachMember(body, func(key []byte, vStart, vEnd int) bool {
		if bytes.EqualFold(key, usageName) {
			bad = json.Unmarshal(body[vStart:vEnd], &w) != nil
		}
		return !bad
	})
	if err != nil || bad || w == nil {
		return Usage{}, false
	}
	w.into(f, &u)
	return u, true
}

var usageName = []byte("usage")

// UsageCounter reads the usage of a streamed answer in its format from
// the events relayed, one at a time: a Chat Completions chunk's "usage"
// (the last one stated), a Messages stream's message_start and
// message_delta, a Responses stream's response.completed (or incomplete,
// or failed). It reads only events that may carry usage, so that the
// others cost a byte search.
type UsageCounter struct {
	f      Format
	hide   bool
	usage  Usage
	seen   bool
	finish []string
	// added is the Data of the event Add read last, until Hide takes it,
	// and addedUsage whether it holds usageKey: Hide of that same event
	// (the same bytes, not a copy) does not look for the key again.
	added      []byte
	addedUsage bool
}

// NewUsageCounter returns a counter for a stream in format f. hide says
// that the client did not ask for usage in its Chat Completions (or legacy
// completions) stream (stream_options.include_usage), which the router
// asked the provider for: Relay keeps it from the client.
func NewUsageCounter(f Format, hide bool) *UsageCounter {
	return &UsageCounter{f: f, hide: hide && (f == Chat || f == Completions)}
}

// Relay reads ev as Add does and returns what of it goes to the client:
// with hide, a chunk that is only usage (no choices) goes nowhere, and
// another one goes without its usage.
func (c *UsageCounter) Relay(ev Event) (Event, bool) {
	c.Add(ev)
	return c.Hide(ev)
}

// Hide returns what of ev goes to the client, as Relay does, without
// reading its usage (an event Add has read already).
func (c *UsageCounter) Hide(ev Event) (Event, bool) {
	if c == nil || !c.hide || !c.holdsUsage(ev.Data) {
		return ev, true
	}
	var e struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if json.Unmarshal(ev.Data, &e) == nil && len(e.Choices) == 0 {
		return Event{}, false
	}
	if out, ok := jsonbody.Without(ev.Data, "usage"); ok {
		ev.Data = out
	}
	return ev, true
}

// holdsUsage reports whether data holds usageKey: what Add found, when
// data is the event Add read last (which it forgets then), or a search.
func (c *UsageCounter) holdsUsage(data []byte) bool {
	if same := len(data) > 0 && len(data) == len(c.added) && &data[0] == &c.added[0]; same {
		c.added = nil
		return c.addedUsage
	}
	return bytes.Contains(data, usageKey)
}

// usageKey is what every spelling of a "usage" key that JSON decoding
// takes holds ("usage", "Usage", "\u0075sage"): the cheap look before a
// decode.
var usageKey = []byte(`sage"`)

// Add reads one relayed event.
func (c *UsageCounter) Add(ev Event) {
	if c == nil {
		return
	}
	if ev.Plain { // no reason, no usage: see Event.Plain
		c.added, c.addedUsage = ev.Data, false
		return
	}
	reason := bytes.Contains(ev.Data, reasonKey) && (bytes.Contains(ev.Data, finishKey) || bytes.Contains(ev.Data, stopKey))
	has := bytes.Contains(ev.Data, usageKey)
	c.added, c.addedUsage = ev.Data, has
	if reason || c.f == Responses && has {
		c.finish = appendFinish(c.finish, c.f, ev.Data, true)
	}
	if !has {
		return
	}
	switch c.f {
	case Messages:
		var e struct {
			Message *struct {
				Usage *wireUsage `json:"usage"`
			} `json:"message"`
			Usage *wireUsage `json:"usage"`
		}
		if json.Unmarshal(ev.Data, &e) != nil {
			return
		}
		if e.Message != nil && e.Message.Usage != nil { // message_start
			e.Message.Usage.into(Messages, &c.usage)
			c.seen = true
		}
		if e.Usage != nil { // message_delta: the output so far, sometimes the input again
			e.Usage.into(Messages, &c.usage)
			c.seen = true
		}
	case Responses:
		var e struct {
			Response *struct {
				Usage *wireUsage `json:"usage"`
			} `json:"response"`
		}
		if json.Unmarshal(ev.Data, &e) == nil && e.Response != nil && e.Response.Usage != nil && !e.Response.Usage.empty() {
			c.usage = Usage{}
			e.Response.Usage.into(Responses, &c.usage)
			c.seen = true
		}
	default:
		var e struct {
			Usage *wireUsage `json:"usage"`
		}
		if json.Unmarshal(ev.Data, &e) == nil && e.Usage != nil && !e.Usage.empty() {
			c.usage = Usage{}
			e.Usage.into(c.f, &c.usage)
			c.seen = true
		}
	}
}

// FinishReasons returns why the streamed answer's choices ended, as the
// format says it (finish_reason, stop_reason, a response's status), in
// the order read.
func (c *UsageCounter) FinishReasons() []string {
	if c == nil {
		return nil
	}
	return c.finish
}

var (
	finishKey = []byte(`"finish_reason":"`)
	stopKey   = []byte(`"stop_reason":"`)
	// reasonKey is what finishKey and stopKey share, from a byte that is
	// rare in JSON: the look for it skips the many quotes of an event,
	// where theirs would stop at each (a third of a stream's relay).
	reasonKey = []byte(`_reason":"`)
)

// FinishReasons reads why a whole answer (a non-streamed body) in format
// f ended: each choice's finish_reason, a message's stop_reason, a
// response's status.
func FinishReasons(f Format, body []byte) []string { return appendFinish(nil, f, body, false) }

// appendFinish adds the finish reasons data states (a whole answer, or a
// stream event) to out.
func appendFinish(out []string, f Format, data []byte, event bool) []string {
	var e struct {
		Choices []struct {
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		StopReason *string `json:"stop_reason"`
		Delta      *struct {
			StopReason *string `json:"stop_reason"`
		} `json:"delta"`
		Status   string `json:"status"`
		Response *struct {
			Status string `json:"status"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &e) != nil {
		return out
	}
	add := func(s *string) {
		if s != nil && *s != "" {
			out = append(out, *s)
		}
	}
	switch f {
	case Messages:
		add(e.StopReason)
		if e.Delta != nil {
			add(e.Delta.StopReason)
		}
	case Responses:
		switch {
		case event && e.Response != nil && e.Response.Status != "" && e.Response.Status != "in_progress" && e.Response.Status != "queued":
			out = append(out[:0], e.Response.Status)
		case !event && e.Status != "":
			out = append(out, e.Status)
		}
	default:
		for _, c := range e.Choices {
			add(c.FinishReason)
		}
	}
	return out
}

// AddMessagesUsage reads a Messages usage object (message_start's or
// message_delta's) into u, as a stream's counter reads it: only what it
// states, never less input than u holds.
func AddMessagesUsage(u *Usage, raw []byte) {
	var w wireUsage
	if json.Unmarshal(raw, &w) == nil {
		w.into(Messages, u)
	}
}

// Usage returns the usage read so far; ok is false when no event stated
// any.
func (c *UsageCounter) Usage() (Usage, bool) {
	if c == nil {
		return Usage{}, false
	}
	return c.usage, c.seen
}
