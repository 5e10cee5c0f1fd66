// Package redact removes secrets from text the router passes on: a
// provider's errors (routed or passed through) and the bodies passed on
// with them, a stream's in-band error, count_tokens answers, what the
// router logs and keeps for the admin API and the status page. One
// redaction for every path, so that no path forgets a shape of key; each
// secret found becomes Placeholder.
//
// A configured secret (the router knows its own: a provider's key, the
// credentials of its header lines, those in its base_url) is redacted
// whatever its length:
//
//   - whole, wherever it appears when it has AnywhereLength bytes or
//     more; a shorter one where it stands as a token, not inside a word
//     (the character before it and the one after it, where the secret's
//     own end is a word character, are not letters, digits, '_' or '-'),
//     so that a two-character key does not eat the words that hold those
//     two characters;
//   - masked, with its mask, where a mask (a run of '*', '•', '·', '…' or
//     of two or more ASCII dots) has before it the secret's first
//     characters, or after it its last: 3 or more of them on one side or
//     2 or more on each ("sk-pro...fXYZ", "****fXYZ", "sk-FAKE****"),
//     those it shows not inside a word ("Thread..." shows nothing of a
//     key that starts with "ead");
//   - cut, where the text ends with AnywhereLength or more of its first
//     characters (a body read to its bound in the middle of the secret).
//
// Any text shaped like a key, or a masked key, is redacted too, configured
// or not (see keyShapes and keyAfterWord): whatever key a provider shows,
// it is one of the router's.
package redact

import (
	"bytes"
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
)

// Placeholder replaces a secret.
const Placeholder = "[redacted]"

// mask is what providers put in place of a key's middle ("sk-ab*****wxyz",
// "sk-ab…wxyz", "sk-ab••••wxyz").
const mask = `*•…·`

// dots is a run of ASCII dots in place of a key's middle
// ("sk-pro...fXYZ"): only where the key's shape or the router's own key
// says so, since ordinary text has them too ("Loading... done").
const dots = `\.{2,}`

// keyChars are the characters of a key on either side of its mask.
const keyChars = `A-Za-z0-9_\-`

// masked is a prefixed key's rest with a mask in it: stars, bullets, an
// ellipsis or ASCII dots.
const masked = `[` + keyChars + `]*(?:[` + mask + `]|` + dots + `)+(?:[` + keyChars + mask + `]|` + dots + `)*`

// keyShapes are the shapes of API keys and of their masked fragments that
// providers put in error messages ("Incorrect API key provided:
// sk-ab*****wxyz"): whatever key they show, it is one of ours, and none
// may reach a log line, the admin API or a client. Each needs the length
// of a real key, or a mask, so that model names ("pplx-70b-online"),
// words ("sk-learn") and regions ("ASIAPACIFIC2") stay.
var keyShapes = regexp.MustCompile(strings.Join([]string{
	// OpenAI, Anthropic (sk-ant-), DeepSeek, OpenRouter (sk-or-)
	`\bsk-(?:[` + keyChars + `]{16,}|` + masked + `)`,
	// Groq, Hugging Face, xAI, Perplexity, Cerebras, NVIDIA
	`\b(?:gsk_|hf_|xai-|pplx-|csk-|nvapi-)(?:[` + keyChars + `]{20,}|` + masked + `)`,
	// Google API keys (39 characters)
	`\bAIza(?:[` + keyChars + `]{16,}|` + masked + `)`,
	// Google OAuth access tokens (Vertex AI's), and JWTs (a service
	// account's signed assertion, an ID token)
	`\bya29\.[A-Za-z0-9_\-]{8,}`,
	`\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*`,
	// AWS access key IDs (20 characters)
	`\b(?:AKIA|ASIA|ABIA|ACCA)(?:[0-9A-Z]{16}\b|[0-9A-Z]*[` + mask + `]+[0-9A-Z` + mask + `]*)`,
	// bearer tokens
	`(?i)\bbearer\s+[A-Za-z0-9._~+/\-` + mask + `]{16,}=*`,
	// any other masked key: two or more characters either side of a mask
	`[` + keyChars + `]{2,}[` + mask + `]{2,}[` + keyChars + `]{2,}`,
}, "|"))

// keyAfterWord is a token named a key, token, secret or password, a
// word or two before it ("Key 3fJk...Nm1 is not valid", "?key=AIza...",
// "API key provided: 0123...cdef", DeepSeek's "Your api key: ****fXYZ is
// invalid"): a long one (an Azure key, 32 hex digits or 84 characters, or
// any other credential), or one with a mask of stars, bullets or an
// ellipsis before or after two or more of its characters.
var keyAfterWord = regexp.MustCompile(`(?i)(\b(?:api[_-]?)?(?:key|token|secret|password|signature|sig)\b(?:\s+[a-z]+){0,2}(?:\s*[:=]\s*|\s+))` +
	`([A-Za-z0-9][A-Za-z0-9+/_.\-` + mask + `]{19,}=*|[` + keyChars + `+/]*[` + mask + `]+[` + keyChars + `+/]{2,}=*|[` + keyChars + `+/]{2,}[` + mask + `]+)`)

// JSON is String for a JSON body passed on as it came. A body with
// escapes ("sk\u002dproj...", "abc\/def") is decoded, redacted string by
// string and encoded again, so that no escaped secret gets through.
func JSON(body []byte, secrets []string) []byte {
	if len(body) == 0 {
		return body
	}
	if bytes.IndexByte(body, '\\') >= 0 && json.Valid(body) {
		var v any
		if json.Unmarshal(body, &v) == nil {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			if enc.Encode(value(v, secrets)) == nil {
				return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
			}
		}
	}
	return []byte(String(string(body), secrets))
}

func value(v any, secrets []string) any {
	switch v := v.(type) {
	case string:
		return String(v, secrets)
	case []any:
		for i := range v {
			v[i] = value(v[i], secrets)
		}
	case map[string]any:
		for k, x := range v {
			v[k] = value(x, secrets)
		}
	}
	return v
}

// String removes from msg the configured secrets (a deployment's:
// router.Deployment.Secrets), whole or masked, and anything shaped like a
// key or a masked key, by the package's rules; secrets may be nil (the
// shapes alone) and hold "" (skipped).
func String(msg string, secrets []string) string {
	if spans := secretSpans(msg, secrets); len(spans) > 0 {
		msg = replace(msg, spans)
	}
	if d := decode(msg); d != nil {
		msg = redactDecoded(msg, d, secrets)
	}
	if keyShapes.MatchString(msg) {
		msg = keyShapes.ReplaceAllString(msg, Placeholder)
	}
	if keyAfterWord.MatchString(msg) {
		msg = keyAfterWord.ReplaceAllString(msg, "${1}"+Placeholder)
	}
	return msg
}

// redactDecoded removes from msg what its decoded form d shows of the
// secrets, or of a key's shape, escaped in msg (see decode).
func redactDecoded(msg string, d *decoded, secrets []string) string {
	spans := secretSpans(d.s, secrets)
	for _, m := range keyShapes.FindAllStringIndex(d.s, -1) {
		spans = append(spans, span{m[0], m[1]})
	}
	if len(spans) == 0 {
		return msg
	}
	for i, sp := range spans {
		spans[i] = d.original(sp)
	}
	return replace(msg, join(spans))
}

// hidden stands in for a URL's userinfo and query values.
const hidden = "xxxxx"

// URL is a configured URL (a base_url) as the status page and the admin
// API show it: its userinfo ("https://xxxxx@host") and every query value
// ("?api-key=xxxxx&api-version=xxxxx": Azure takes its key there) and
// fragment masked, the rest as configured; "" when s is no URL.
func URL(s string) string {
	if _, err := url.Parse(s); err != nil {
		return ""
	}
	return URLAsWritten(s)
}

// URLAsWritten is s masked as URL masks it, as text: for a URL quoted as
// configured, placeholders and all, or one that does not parse (an error
// quotes it: "base_url \"https://xxxxx@host/v1/chat/completions\" is an
// endpoint").
func URLAsWritten(s string) string {
	rest, frag, _ := strings.Cut(s, "#")
	rest, query, hasQuery := strings.Cut(rest, "?")
	if i := strings.Index(rest, "//"); i >= 0 {
		auth := rest[i+2:]
		if j := strings.IndexByte(auth, '/'); j >= 0 {
			auth = auth[:j]
		}
		if at := strings.LastIndexByte(auth, '@'); at >= 0 {
			rest = rest[:i+2] + hidden + rest[i+2+at:]
		}
	}
	if hasQuery && query != "" {
		parts := strings.Split(query, "&")
		for i, p := range parts {
			if name, _, ok := strings.Cut(p, "="); ok {
				parts[i] = name + "=" + hidden
			} else if p != "" {
				parts[i] = hidden
			}
		}
		rest += "?" + strings.Join(parts, "&")
	}
	if frag != "" {
		rest += "#" + hidden
	}
	return rest
}
