package adapters

import (
	"context"
	"net/http"

	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// The plan of Anthropic's models (the Messages API), written once for the
// three types that serve them: anthropic (Anthropic's own API), bedrock
// (InvokeModel) and vertex (rawPredict). A Messages request goes as the
// client wrote it, its answers and stream passed on as they come; any
// other format goes through its Chat form, translated to a Messages body
// (messages.FromChat), and its answers translated back to Chat. A resume's
// request is continued as a prefill (prefill). What differs from one host
// to the next is claudeHost's.

// claudeHost is a type that serves Anthropic's models: how the host wants
// the Messages body, where it goes and how it is authenticated, and how
// its answers are read.
type claudeHost interface {
	// claudeBody returns the upstream body of body, a Messages body for
	// model: the client's (r.Format Messages) or one made from r's Chat
	// form (the model already in it).
	claudeBody(body []byte, model string, r *provider.Request) ([]byte, error)
	// claudePost builds the upstream request of body for model, with what
	// of the client's Messages headers (r.Header) the host takes.
	claudePost(ctx context.Context, model string, body []byte, r *provider.Request) (*http.Request, error)
	// claudeReader reads the host's answers and streams: passed on as they
	// come (native, a Messages request's) or translated to Chat.
	claudeReader(native bool) reader
	// claudeErrorsNative reports whether the host's errors are Messages
	// errors too (Anthropic's own API), so that a Messages client gets
	// them as they came (provider.Plan.Native); the clouds' are their own,
	// restated.
	claudeErrorsNative() bool
}

// planClaude plans req on model, one of Anthropic's models at host h.
// model is the model as the Messages body names it (and as a Chat answer
// that names none does). It fails when req holds what the Messages API
// cannot express (messages.FromChat), or is a resume's that Claude does
// not continue (prefill).
func planClaude(ctx context.Context, h claudeHost, model string, r *provider.Request) (provider.Plan, error) {
	msg := r.Body
	if r.Format != provider.Messages {
		chat, err := r.Chat()
		if err != nil {
			return nil, err
		}
		if msg, err = messages.FromChat(chat, model, r.Stream); err != nil {
			return nil, err
		}
	}
	body, err := h.claudeBody(msg, model, r)
	if err != nil {
		return nil, err
	}
	if err := prefill(body, r); err != nil {
		return nil, err
	}
	req, err := h.claudePost(ctx, model, body, r)
	if err != nil {
		return nil, err
	}
	if r.Format != provider.Messages {
		return chatPlan(req, model, r, false, h.claudeReader(false)), nil
	}
	return &plan{req: req, format: provider.Messages, native: h.claudeErrorsNative(), model: model, r: h.claudeReader(true)}, nil
}

// Anthropic's own API: the model in the body, the version in the
// anthropic-version header (the client's own on a Messages request, with
// its anthropic-beta features: its choice), the key in x-api-key.

func (*Anthropic) claudeBody(body []byte, model string, r *provider.Request) ([]byte, error) {
	if r.Format != provider.Messages {
		return body, nil
	}
	return provider.SetModel(body, model)
}

func (p *Anthropic) claudePost(ctx context.Context, _ string, body []byte, r *provider.Request) (*http.Request, error) {
	req, err := p.post(ctx, body, r.Stream)
	if err != nil || r.Format != provider.Messages {
		return req, err
	}
	for k, v := range r.Header {
		req.Header[k] = v
	}
	return req, nil
}

func (*Anthropic) claudeReader(native bool) reader { return anthropicReader{native: native} }

func (*Anthropic) claudeErrorsNative() bool { return true }

// Bedrock's InvokeModel: the model in the URL, BedrockAnthropicVersion in
// the body, a Messages client's anthropic-beta features as the body's
// anthropic_beta; streams in AWS's event stream.

func (*Bedrock) claudeBody(body []byte, _ string, r *provider.Request) ([]byte, error) {
	var betas []string
	if r.Format == provider.Messages {
		betas = anthropicBetas(r.Header)
	}
	return cloudMessages(body, BedrockAnthropicVersion, false, betas)
}

func (p *Bedrock) claudePost(ctx context.Context, model string, body []byte, r *provider.Request) (*http.Request, error) {
	op := "/invoke"
	if r.Stream {
		op = "/invoke-with-response-stream"
	}
	return p.post(ctx, model, op, body, r.Stream)
}

func (*Bedrock) claudeReader(native bool) reader { return bedrockInvokeReader{native: native} }

func (*Bedrock) claudeErrorsNative() bool { return false }

// Vertex AI's rawPredict: the model in the URL (publisher anthropic),
// VertexAnthropicVersion and "stream" in the body, a Messages client's
// anthropic-beta header passed on.

func (*Vertex) claudeBody(body []byte, _ string, r *provider.Request) ([]byte, error) {
	return cloudMessages(body, VertexAnthropicVersion, r.Stream, nil)
}

func (p *Vertex) claudePost(ctx context.Context, model string, body []byte, r *provider.Request) (*http.Request, error) {
	target := p.modelURL("anthropic", model)
	if r.Stream {
		target += ":streamRawPredict"
	} else {
		target += ":rawPredict"
	}
	req, err := p.post(ctx, target, body, r.Stream)
	if err != nil || r.Format != provider.Messages {
		return req, err
	}
	if betas := r.Header.Values("Anthropic-Beta"); len(betas) > 0 {
		req.Header["Anthropic-Beta"] = betas
	}
	return req, nil
}

func (*Vertex) claudeReader(native bool) reader { return anthropicReader{native: native} }

func (*Vertex) claudeErrorsNative() bool { return false }

// Interface guards
var (
	_ claudeHost = (*Anthropic)(nil)
	_ claudeHost = (*Bedrock)(nil)
	_ claudeHost = (*Vertex)(nil)
)
