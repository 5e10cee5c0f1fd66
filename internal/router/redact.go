package router

import (
	"github.com/llmrouter/caddy-llm-router/internal/redact"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// redact removes secrets from what the attempt keeps of a failed answer:
// the provider's message and code (logged, kept for the admin API,
// restated to the client) and the body a client error is passed on with;
// from an answer, the secrets whole (redact.Answer: the model's text is
// not searched for key shapes, which it may well write).
func (o *outcome) redact(secrets []string) {
	if o.obs.Class == provider.OK {
		o.body = redact.Answer(o.body, secrets)
		return
	}
	o.obs.Message = redact.String(o.obs.Message, secrets)
	o.obs.Code = redact.String(o.obs.Code, secrets)
	o.body = redact.JSON(o.body, secrets)
}
