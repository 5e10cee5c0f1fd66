package router

import (
	"bytes"
	"regexp"
	"strings"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// redactedSecret replaces a secret found in a provider's answer.
const redactedSecret = "[redacted]"

// keyShapes are the shapes of API keys and of their masked fragments that
// providers put in error messages ("Incorrect API key provided:
// sk-ab*****wxyz"): whatever key they show, it is one of ours, and none
// may reach a log line, the admin API or a client.
var keyShapes = regexp.MustCompile(strings.Join([]string{
	`\bsk-[A-Za-z0-9_*.\-]{3,}`,                              // OpenAI, Anthropic (sk-ant-), DeepSeek, OpenRouter (sk-or-), masked or not
	`\b(?:gsk|hf|xai|pplx|csk|nvapi)[_-][A-Za-z0-9_*\-]{6,}`, // Groq, Hugging Face, xAI, Perplexity, Cerebras, NVIDIA
	`\bAIza[0-9A-Za-z_*\-]{6,}`,                              // Google API keys
	`\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z*]{8,}`,                 // AWS access key IDs
	`(?i)\bbearer\s+[A-Za-z0-9._~+/*\-]+=*`,                  // bearer tokens
	`\b[0-9a-fA-F]{32}\b`,                                    // Azure keys (32 hex digits)
	`[A-Za-z0-9_\-]{0,16}\*{3,}[A-Za-z0-9_\-]{0,16}`,         // any other masked key
}, "|"))

// redact removes secrets from what the attempt keeps of a failed answer:
// the provider's message (logged, kept for the admin API) and the body a
// client error is passed on with.
func (o *outcome) redact(secrets []string) {
	if o.obs.Class == provider.OK {
		return
	}
	o.obs.Message = redact(o.obs.Message, secrets)
	for _, s := range secrets {
		if len(s) >= 8 && bytes.Contains(o.body, []byte(s)) {
			o.body = bytes.ReplaceAll(o.body, []byte(s), []byte(redactedSecret))
		}
	}
	if keyShapes.Match(o.body) {
		o.body = keyShapes.ReplaceAll(o.body, []byte(redactedSecret))
	}
}

// redact removes from msg the deployment's secrets (its key, the
// credentials of its header lines) and anything shaped like a key.
func redact(msg string, secrets []string) string {
	for _, s := range secrets {
		if len(s) >= 8 {
			msg = strings.ReplaceAll(msg, s, redactedSecret)
		}
	}
	if keyShapes.MatchString(msg) {
		msg = keyShapes.ReplaceAllString(msg, redactedSecret)
	}
	return msg
}
