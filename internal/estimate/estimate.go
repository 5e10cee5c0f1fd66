// Package estimate counts a request's prompt tokens before it is sent, for
// budgets, declared tpm and the context-window pre-check.
//
// Two counts:
//
//   - Prompt, cheap and for every request: the body's bytes / 4, less the
//     inline binary payloads (base64 images, audio, documents), each of
//     which counts PayloadTokens instead. Providers count an image by its
//     pixels, not by its bytes (OpenAI: 85 to 1,105 tokens for a tile grid,
//     https://platform.openai.com/docs/guides/images-vision#calculating-costs;
//     Anthropic: about width x height / 750, at most about 1,600,
//     https://docs.anthropic.com/en/docs/build-with-claude/vision; Gemini:
//     258 per image, https://ai.google.dev/gemini-api/docs/tokens), so a
//     screenshot of 1 MB is ~1,600 tokens, not the 330,000 its base64 would
//     make at bytes / 4.
//   - Exact, on demand: the same text counted with OpenAI's o200k_base
//     tokenizer (GPT-4o, GPT-4.1, GPT-5, o-series), via
//     github.com/tiktoken-go/tokenizer. It costs about 0.35 µs per token
//     (BenchmarkExact): the router asks for it only when the cheap count
//     is near a context window it must decide on.
package estimate

import (
	"bytes"
	"strings"
	"sync"

	"github.com/tiktoken-go/tokenizer/codec"
)

// PayloadTokens is what one inline binary payload (a base64 image, audio
// clip or document) counts, whatever its size.
const PayloadTokens = 1600

// minPayload is the shortest JSON string taken for a binary payload: a
// base64 run this long without a space is no text.
const minPayload = 1024

// Prompt returns the cheap prompt-token count of a JSON request body: its
// bytes / 4 plus 1, less its binary payloads, which count PayloadTokens
// each.
func Prompt(body []byte) int64 {
	payloads, payloadBytes := scan(body, nil)
	return int64(len(body)-payloadBytes)/4 + 1 + int64(payloads)*PayloadTokens
}

// Exact returns the prompt-token count of a JSON request body by OpenAI's
// o200k_base tokenizer: the body's text without its binary payloads, which
// count PayloadTokens each. The JSON's own keys and punctuation are
// counted too (a few tokens per message: about what the chat format adds).
func Exact(body []byte) int64 {
	var text bytes.Buffer
	text.Grow(len(body))
	payloads, _ := scan(body, &text)
	n, err := o200k().Count(text.String())
	if err != nil {
		return Prompt(body)
	}
	return int64(n) + int64(payloads)*PayloadTokens
}

var o200k = sync.OnceValue(codec.NewO200kBase)

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

// scan finds the binary payloads of a JSON body: its string values of
// minPayload bytes or more made only of base64 characters, after an
// optional data URL head ("data:image/png;base64,"). It returns how many
// there are and their bytes; the rest of the body, when text is not nil,
// is written to it.
func scan(body []byte, text *bytes.Buffer) (payloads, payloadBytes int) {
	from := 0 // the first byte not yet written to text
	for i := 0; i < len(body); {
		q := bytes.IndexByte(body[i:], '"')
		if q < 0 {
			break
		}
		start := i + q + 1
		end := closingQuote(body, start)
		if end < 0 {
			break
		}
		if end-start >= minPayload && isPayload(body[start:end]) {
			payloads++
			payloadBytes += end - start
			if text != nil {
				text.Write(body[from:start])
				from = end
			}
		}
		i = end + 1
	}
	if text != nil {
		text.Write(body[from:])
	}
	return payloads, payloadBytes
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

// isPayload reports whether a JSON string's content is base64 (standard or
// URL alphabet, "\/" as JSON may escape "/", wrapped in lines or not),
// after an optional data URL head.
func isPayload(s []byte) bool {
	if bytes.HasPrefix(s, []byte("data:")) {
		i := bytes.Index(s[:min(len(s), 256)], []byte(";base64,"))
		if i < 0 {
			return false
		}
		s = s[i+len(";base64,"):]
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '/', c == '=', c == '-', c == '_':
		case c == '\\' && i+1 < len(s) && (s[i+1] == '/' || s[i+1] == 'n' || s[i+1] == 'r'):
			i++ // "\/" as JSON may escape "/"; a line break of wrapped base64 (MIME, GNU base64)
		default:
			return false
		}
	}
	return len(s) >= minPayload/2
}
