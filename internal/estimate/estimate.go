// Package estimate counts a request's prompt tokens before it is sent, for
// budgets, declared tpm and the context-window pre-check.
//
// Two counts:
//
//   - Prompt, cheap and for every request: the body's bytes / 4, less the
//     inline binary payloads (base64 images, audio, documents), each of
//     which counts its bytes / 4 up to PayloadTokens instead. Providers count an image by its
//     pixels, not by its bytes (OpenAI: 85 to 1,105 tokens for a tile grid,
//     https://platform.openai.com/docs/guides/images-vision#calculating-costs;
//     Anthropic: about width x height / 750, at most about 1,600,
//     https://docs.anthropic.com/en/docs/build-with-claude/vision; Gemini:
//     258 per image, https://ai.google.dev/gemini-api/docs/tokens), so a
//     screenshot of 1 MB is ~1,600 tokens, not the 330,000 its base64 would
//     make at bytes / 4.
//   - Exact, on demand: the body's string values, decoded, counted with
//     OpenAI's o200k_base tokenizer (GPT-4o, GPT-4.1, GPT-5, o-series),
//     via github.com/tiktoken-go/tokenizer, up to a limit. It costs about
//     0.3 µs per token counted (BenchmarkExact): the router asks for it
//     only when the cheap count is near a context window it must decide
//     on, and counts no further than that window.
package estimate

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"sync"

	"github.com/tiktoken-go/tokenizer/codec"
)

// PayloadTokens is the most one inline binary payload (a base64 image,
// audio clip or document) counts: less only when its bytes / 4 are less.
const PayloadTokens = 1600

// minPayload is the shortest JSON string taken for a binary payload
// without a data URL head: a base64 run this long, without a space and
// with capitals, small letters and digits all in it, is no text (hex and
// DNA have one case only).
const minPayload = 1024

// payloadTokens is what a payload of n bytes counts.
func payloadTokens(n int) int64 { return min(int64(n)/4+1, PayloadTokens) }

// Prompt returns the cheap prompt-token count of a JSON request body: its
// bytes / 4 plus 1, less its binary payloads, which count their bytes / 4
// up to PayloadTokens each.
func Prompt(body []byte) int64 {
	payloadBytes, payloadTok := scan(body, nil)
	return int64(len(body)-payloadBytes)/4 + 1 + payloadTok
}

// Exact counts a JSON request body's prompt tokens by OpenAI's o200k_base
// tokenizer: its string values, decoded (a "\u4e2d" is the character it
// escapes), each binary payload as in Prompt. It stops once the count
// passes limit (complete false: the prompt has more than limit tokens),
// so that its cost is bounded by the window it decides on, about 0.3 µs
// per token counted. ok is false when as many counts as half the CPUs are
// under way already: the caller decides without it.
func Exact(body []byte, limit int64) (n int64, complete, ok bool) {
	select {
	case exactSlots <- struct{}{}:
		defer func() { <-exactSlots }()
	default:
		return 0, false, false
	}
	c := counter{limit: limit}
	_, payloads := scan(body, c.add)
	c.flush()
	c.n += payloads
	return c.n, c.n <= limit, true
}

// exactSlots bounds the counts under way: a count of a large prompt takes
// tens of milliseconds of one CPU.
var exactSlots = make(chan struct{}, max(1, runtime.GOMAXPROCS(0)/2))

var o200k = sync.OnceValue(codec.NewO200kBase)

// counter counts text in chunks of about chunkBytes, cut at white space,
// until its count passes limit.
type counter struct {
	buf   []byte
	n     int64
	limit int64
}

const chunkBytes = 16 << 10

// add takes one JSON string of the body (raw, quotes excluded).
func (c *counter) add(raw []byte) {
	if c.n > c.limit {
		return
	}
	text := raw
	if bytes.IndexByte(raw, '\\') >= 0 {
		var s string
		q := make([]byte, 0, len(raw)+2)
		q = append(append(append(q, '"'), raw...), '"')
		if json.Unmarshal(q, &s) == nil {
			text = []byte(s)
		}
	}
	for len(text) > 0 && c.n <= c.limit {
		room := chunkBytes - len(c.buf)
		if len(text) <= room {
			c.buf = append(append(c.buf, text...), '\n')
			return
		}
		cut := room
		if i := bytes.LastIndexAny(text[:room], " \n\t"); i > room/2 {
			cut = i + 1
		}
		c.buf = append(c.buf, text[:cut]...)
		text = text[cut:]
		c.flush()
	}
}

// flush counts the chunk held.
func (c *counter) flush() {
	if len(c.buf) == 0 || c.n > c.limit {
		return
	}
	n, err := o200k().Count(string(c.buf))
	if err != nil {
		n = len(c.buf) / 4
	}
	c.n += int64(n)
	c.buf = c.buf[:0]
}

// O200k reports whether an upstream model counts tokens with o200k_base:
// OpenAI's GPT-4o, GPT-4.1, GPT-4.5, GPT-5 and o-series models and their
// dated or suffixed names (gpt-4o-mini-2024-07-18), and gpt-oss, whose
// o200k_harmony only adds special tokens (the encodings OpenAI's tiktoken
// maps model names to: https://github.com/openai/tiktoken/blob/main/tiktoken/model.py).
func O200k(model string) bool {
	m := strings.ToLower(model)
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:] // openai/gpt-oss-120b, as some hosts name it
	}
	for _, p := range []string{"gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "gpt-oss", "chatgpt-4o", "o1", "o3", "o4"} {
		if strings.HasPrefix(m, p) && (len(m) == len(p) || m[len(p)] == '-' || m[len(p)] == '.') {
			return true
		}
	}
	return false
}

// scan finds the binary payloads of a JSON body: its string values that
// are base64 (isPayload). It returns their bytes and what they count
// (payloadTokens each); every other string value, when text is not nil,
// is passed to it (raw, without its quotes).
func scan(body []byte, text func(raw []byte)) (payloadBytes int, payloadTok int64) {
	for i := 0; i < len(body); {
		q := bytes.IndexByte(body[i:], '"')
		if q < 0 {
			break
		}
		start := i + q + 1
		end := closingQuote(body, start)
		if end < 0 {
			if text != nil {
				text(body[start:]) // a cut body: what is left
			}
			break
		}
		switch {
		case isPayload(body[start:end]):
			payloadBytes += end - start
			payloadTok += payloadTokens(end - start)
		case text != nil:
			text(body[start:end])
		}
		i = end + 1
	}
	return payloadBytes, payloadTok
}

// closingQuote returns the index of the quote that closes the JSON string
// whose content starts at start, -1 when there is none.
func closingQuote(body []byte, start int) int {
	for i := start; i < len(body); {
		q := bytes.IndexByte(body[i:], '"')
		if q < 0 {
			return -1
		}
		j := i + q
		backslashes := 0
		for k := j - 1; k >= start && body[k] == '\\'; k-- {
			backslashes++
		}
		if backslashes%2 == 0 {
			return j
		}
		i = j + 1
	}
	return -1
}

// isPayload reports whether a JSON string's content is a binary payload:
// a data URL with base64 content, or base64 of minPayload bytes or more
// (standard or URL alphabet, "\\/" as JSON may escape "/", wrapped in
// lines or not) with capitals, small letters and digits all in it.
func isPayload(s []byte) bool {
	dataURL := false
	if bytes.HasPrefix(s, []byte("data:")) {
		i := bytes.Index(s[:min(len(s), 256)], []byte(";base64,"))
		if i < 0 {
			return false
		}
		s, dataURL = s[i+len(";base64,"):], true
	}
	if !dataURL && len(s) < minPayload {
		return false
	}
	var upper, lower, digit bool
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'A' && c <= 'Z':
			upper = true
		case c >= 'a' && c <= 'z':
			lower = true
		case c >= '0' && c <= '9':
			digit = true
		case c == '+', c == '/', c == '=', c == '-', c == '_':
		case c == '\\' && i+1 < len(s) && (s[i+1] == '/' || s[i+1] == 'n' || s[i+1] == 'r'):
			i++ // "\\/" as JSON may escape "/"; a line break of wrapped base64 (MIME, GNU base64)
		default:
			return false
		}
	}
	return dataURL || upper && lower && digit
}
