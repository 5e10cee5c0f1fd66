package router

import (
	"context"
	"net"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Tracing: each upstream attempt is a span, a child of the request's span
// when the request has one (Caddy's tracing directive starts it), made by
// that span's own tracer provider; without one it costs a no-op span.
// Attributes follow OpenTelemetry's semantic conventions for generative AI
// (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/) and
// add the router's own (llm_router.*).

// tracerName is the instrumentation scope of the router's spans.
const tracerName = "github.com/llmrouter/caddy-llm-router/router"

// providerName is gen_ai.provider.name for d: what its provider type
// states (provider.TraceNamer), else the type's name.
func providerName(d *Deployment) string {
	if n, ok := d.Provider.(provider.TraceNamer); ok {
		if name := n.GenAIProviderName(); name != "" {
			return name
		}
	}
	return d.ProviderType
}

// operation is gen_ai.operation.name for a request format.
func operation(f provider.Format) string {
	switch f {
	case provider.Embeddings:
		return "embeddings"
	case provider.Completions:
		return "text_completion"
	}
	return "chat"
}

// startSpan starts the span of an attempt on d: the attempt's number in
// the request (1 for the first), the class of the failure it fails over
// from (OK for none) and how long the request waited since the last
// attempt ended (or since it began).
func startSpan(ctx context.Context, d *Deployment, req *Request, plan provider.Plan, number int, from provider.Class, waited time.Duration) trace.Span {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return nil // no request span: no tracing
	}
	op := operation(req.Format)
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", op),
		attribute.String("gen_ai.provider.name", providerName(d)),
		attribute.String("gen_ai.request.model", d.Model),
		attribute.String("llm_router.deployment", d.Name),
		attribute.Int("llm_router.attempt", number),
		attribute.Bool("llm_router.stream", req.Stream),
		attribute.Float64("llm_router.wait_seconds", waited.Seconds()),
	}
	if from != provider.OK {
		attrs = append(attrs, attribute.String("llm_router.failover_reason", from.String()))
	}
	if u := plan.Request().URL; u != nil {
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil {
			host, port = u.Host, map[string]string{"https": "443", "http": "80"}[u.Scheme]
		}
		attrs = append(attrs, attribute.String("server.address", host))
		if p, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, attribute.Int("server.port", p))
		}
	}
	_, span := parent.TracerProvider().Tracer(tracerName).Start(ctx, op+" "+d.Model,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	return span
}

// endSpan ends an attempt's span with how it ended: its class (error.type
// and an error status when it failed), and what the answer used and why
// it finished, when it said.
func endSpan(span trace.Span, class provider.Class, msg string, u provider.Usage, stated bool, finish []string, responseModel string) {
	if span == nil {
		return
	}
	if class != provider.OK {
		span.SetAttributes(attribute.String("error.type", class.String()))
		span.SetStatus(codes.Error, msg)
	}
	if stated {
		span.SetAttributes(
			attribute.Int64("gen_ai.usage.input_tokens", u.InputTokens),
			attribute.Int64("gen_ai.usage.output_tokens", u.OutputTokens),
			attribute.Int64("llm_router.usage.cached_input_tokens", u.CachedInputTokens),
			attribute.Int64("llm_router.usage.reasoning_tokens", u.ReasoningTokens),
		)
	}
	if len(finish) > 0 {
		span.SetAttributes(attribute.StringSlice("gen_ai.response.finish_reasons", finish))
	}
	if responseModel != "" {
		span.SetAttributes(attribute.String("gen_ai.response.model", responseModel))
	}
	span.End()
}
