package llmrouter

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// served is what serving a request tells its access log entry (the llm_*
// fields) and later handlers (the {http.llm_router.*} placeholders): the
// handler fills it in as it serves, and its values are read only when the
// entry is written or a placeholder resolved. One access log field
// (inline) and one replacer provider per request, whatever the number of
// values: Caddy's ExtraLogFields.Set drops its handler cache on every
// call, and each Replacer.Set stores into a map, which cost a request
// about 30 allocations when each value was set on its own.
//
// A value once told stays until told again, as Set's did: a WebSocket
// turn (served as the handler's own POST, with the upgrade's replacer and
// log fields) overwrites what an earlier turn told.
type served struct {
	// identified: the consumer (identify, consumers.go) is known.
	identified bool
	consumer   string
	// annotated: what answered (annotate) is known.
	annotated                              bool
	deployment, failoverReason, modelGroup string
	attempts                               int
	// accounted: what the answer used (account) is known.
	accounted bool
	usage     provider.Usage
	costUSD   float64
	// A resumed stream's: how many times it was taken up, on which
	// deployment it ended, and why it broke (empty: it did not).
	resumes     int
	resumedOn   string
	streamError string
}

// servedKey is where a request's served is kept in its replacer: no
// placeholder can name it (the NUL).
const servedKey = "http.llm_router\x00served"

// servedField is the access log field that writes served's values inline,
// as top-level fields (its key only makes ExtraLogFields.Set replace it
// rather than add it again).
const servedField = "llm_router"

// servedOf returns r's served, made (and given to its replacer and access
// log fields) on first use; nil when r's context has neither (a request
// that did not come through Caddy's server).
func servedOf(r *http.Request) *served {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	extra, _ := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields)
	if repl == nil && extra == nil {
		return nil
	}
	if repl != nil {
		if v, ok := repl.Get(servedKey); ok {
			if s, ok := v.(*served); ok {
				return s
			}
		}
	}
	s := new(served)
	if repl != nil {
		repl.Set(servedKey, s)
		repl.Map(s.placeholder)
	}
	if extra != nil {
		extra.Set(zap.Field{Key: servedField, Type: zapcore.InlineMarshalerType, Interface: s})
	}
	return s
}

// usageFields name the usage's counts, as placeholders
// ({http.llm_router.input_tokens}) and log fields (llm_input_tokens).
var usageFields = []struct {
	name, field string
	n           func(u *provider.Usage) int64
}{
	{"input_tokens", "llm_input_tokens", func(u *provider.Usage) int64 { return u.InputTokens }},
	{"output_tokens", "llm_output_tokens", func(u *provider.Usage) int64 { return u.OutputTokens }},
	{"cached_input_tokens", "llm_cached_input_tokens", func(u *provider.Usage) int64 { return u.CachedInputTokens }},
	{"cache_write_tokens", "llm_cache_write_tokens", func(u *provider.Usage) int64 { return u.CacheWriteTokens }},
	{"cache_write_1h_tokens", "llm_cache_write_1h_tokens", func(u *provider.Usage) int64 { return u.CacheWrite1hTokens }},
	{"reasoning_tokens", "llm_reasoning_tokens", func(u *provider.Usage) int64 { return u.ReasoningTokens }},
}

// placeholder resolves {http.llm_router.*} (a caddy.ReplacerFunc): the
// consumer once identified ("" for the anonymous one); the deployment,
// attempts, failover_reason and model_group once annotated;
// the usage's counts and cost_usd (a decimal string) once accounted.
func (s *served) placeholder(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, "http.llm_router.")
	if !ok {
		return nil, false
	}
	if s.identified && name == "consumer" {
		return s.consumer, true
	}
	if s.annotated {
		switch name {
		case "deployment":
			return s.deployment, true
		case "attempts":
			return s.attempts, true
		case "failover_reason":
			return s.failoverReason, true
		case "model_group":
			return s.modelGroup, true
		}
	}
	if s.accounted {
		if name == "cost_usd" {
			return strconv.FormatFloat(s.costUSD, 'f', -1, 64), true
		}
		for _, f := range usageFields {
			if f.name == name {
				return f.n(&s.usage), true
			}
		}
	}
	return nil, false
}

// MarshalLogObject implements zapcore.ObjectMarshaler: the access log's
// consumer (once identified), llm_deployment, llm_attempts, llm_failover_reason and llm_model_group;
// llm_resumes, llm_resumed_on and llm_stream_error of a stream that broke;
// llm_input_tokens (and the usage's other counts) and llm_cost_usd.
func (s *served) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	if s.identified {
		enc.AddString("consumer", s.consumer)
	}
	if s.annotated {
		enc.AddString("llm_deployment", s.deployment)
		enc.AddInt("llm_attempts", s.attempts)
		enc.AddString("llm_failover_reason", s.failoverReason)
		enc.AddString("llm_model_group", s.modelGroup)
	}
	if s.resumes > 0 {
		enc.AddInt("llm_resumes", s.resumes)
		enc.AddString("llm_resumed_on", s.resumedOn)
	}
	if s.streamError != "" {
		enc.AddString("llm_stream_error", s.streamError)
	}
	if s.accounted {
		for _, f := range usageFields {
			enc.AddInt64(f.field, f.n(&s.usage))
		}
		enc.AddFloat64("llm_cost_usd", s.costUSD)
	}
	return nil
}
