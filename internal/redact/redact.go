// Package redact removes secrets from text the router passes on: a
// provider's answers and errors (routed or passed through), a stream's
// in-band error, what the router logs and keeps for the admin API and
// the status page. One redaction for every path, so that no path forgets
// a shape of key.
package redact

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
)

// Placeholder replaces a secret.
const Placeholder = "[redacted]"

// mask is what providers put in place of a key's middle ("sk-ab*****wxyz",
// "sk-ab…wxyz", "sk-ab••••wxyz").
const mask = `*•…·`

// keyShapes are the shapes of API keys and of their masked fragments that
// providers put in error messages ("Incorrect API key provided:
// sk-ab*****wxyz"): whatever key they show, it is one of ours, and none
// may reach a log line, the admin API or a client. Each needs the length
// of a real key, or a mask, so that model names ("pplx-70b-online"),
// words ("sk-learn") and regions ("ASIAPACIFIC2") stay.
var keyShapes = regexp.MustCompile(strings.Join([]string{
	// OpenAI, Anthropic (sk-ant-), DeepSeek, OpenRouter (sk-or-)
	`\bsk-(?:[A-Za-z0-9_\-]{16,}|[A-Za-z0-9_\-]*[` + mask + `]+[A-Za-z0-9_\-` + mask + `]*)`,
	// Groq, Hugging Face, xAI, Perplexity, Cerebras, NVIDIA
	`\b(?:gsk_|hf_|xai-|pplx-|csk-|nvapi-)(?:[A-Za-z0-9_\-]{20,}|[A-Za-z0-9_\-]*[` + mask + `]+[A-Za-z0-9_\-` + mask + `]*)`,
	// Google API keys (39 characters)
	`\bAIza(?:[0-9A-Za-z_\-]{16,}|[0-9A-Za-z_\-]*[` + mask + `]+[0-9A-Za-z_\-` + mask + `]*)`,
	// Google OAuth access tokens (Vertex AI's), and JWTs (a service
	// account's signed assertion, an ID token)
	`\bya29\.[A-Za-z0-9_\-]{8,}`,
	`\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*`,
	// AWS access key IDs (20 characters)
	`\b(?:AKIA|ASIA|ABIA|ACCA)(?:[0-9A-Z]{16}\b|[0-9A-Z]*[` + mask + `]+[0-9A-Z` + mask + `]*)`,
	// bearer tokens
	`(?i)\bbearer\s+[A-Za-z0-9._~+/\-` + mask + `]{16,}=*`,
	// any other masked key: two or more characters either side of a mask
	`[A-Za-z0-9_\-]{2,}[` + mask + `]{2,}[A-Za-z0-9_\-]{2,}`,
}, "|"))

// keyAfterWord is a long token named a key, token, secret or password,
// a word or two before it ("Key 3fJk...Nm1 is not valid", "?key=AIza...",
// "API key provided: 0123...cdef"): an Azure key (32 hex digits, or 84
// characters) or any other credential.
var keyAfterWord = regexp.MustCompile(`(?i)(\b(?:api[_-]?)?(?:key|token|secret|password|signature|sig)\b(?:\s+[a-z]+){0,2}(?:\s*[:=]\s*|\s+))([A-Za-z0-9][A-Za-z0-9+/_.\-` + mask + `]{19,}=*)`)

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

// String removes from msg the deployment's secrets (its key, the
// credentials of its header lines) and anything shaped like a key.
func String(msg string, secrets []string) string {
	for _, s := range secrets {
		if len(s) >= 8 {
			msg = strings.ReplaceAll(msg, s, Placeholder)
		}
	}
	if keyShapes.MatchString(msg) {
		msg = keyShapes.ReplaceAllString(msg, Placeholder)
	}
	if keyAfterWord.MatchString(msg) {
		msg = keyAfterWord.ReplaceAllString(msg, "${1}"+Placeholder)
	}
	return msg
}
