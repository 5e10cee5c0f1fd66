package mockllm

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("llm_mock", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("llm_mock", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	if err := m.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	return m, nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	llm_mock [<matcher>] {
//	    dialect           openai|anthropic|gemini|bedrock|vertex
//	    model             <name>
//	    latency           <duration>
//	    first_token_delay <duration>
//	    chunks            <count>
//	    chunk_interval    <duration>
//	    reply             <text>
//	    api_key           <key>
//	    aws_credentials   <access_key_id> <secret_access_key>
//	    token_lifetime    <duration>
//	    tool_call         <name> <arguments as a JSON object>
//	    continuation      accept|reject
//	    rate_limit {
//	        requests <count>
//	        tokens   <count>
//	        window   <duration>
//	    }
//	    fault rate_limit|status|hang|cut|error_event|keepalive|stall|malformed|slow {
//	        every       <n>
//	        from        <duration>
//	        for         <duration>
//	        status      <code>
//	        header      <name> <value>
//	        body        <text>
//	        after       <chunks>
//	        retry_delay <duration>
//	        quota_id    <id>
//	        quota       requests|tokens|tokens_per_day|shared|per_minute|per_day
//	        delay       <duration>
//	    }
//	}
//
// Every subdirective is optional and may appear once, except fault
// (repeatable, tried in order) and header inside fault (repeatable).
// The block may be omitted for a mock with all defaults. dialect
// defaults to openai; unknown dialects are rejected here and by
// Validate, as are aws_credentials outside the bedrock dialect,
// token_lifetime outside vertex, api_key in vertex, an unknown
// continuation and a quota of another dialect (bedrock: requests, tokens, tokens_per_day; vertex:
// shared, per_minute, per_day). The fields are documented on Handler,
// AWSCredentials, RateLimit and Fault.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for d.NextBlock(0) {
		name := d.Val()
		if name != "fault" {
			if seen[name] {
				return d.Errf("duplicate subdirective %q", name)
			}
			seen[name] = true
		}
		var err error
		switch name {
		case "dialect":
			h.Dialect, err = oneArg(d)
			if err == nil && dialectOf(h.Dialect) < 0 {
				err = d.Errf("unknown dialect %q (want openai, anthropic, gemini, bedrock or vertex)", h.Dialect)
			}
		case "model":
			h.Model, err = oneArg(d)
		case "latency":
			h.Latency, err = durationArg(d)
		case "first_token_delay":
			h.FirstTokenDelay, err = durationArg(d)
		case "chunks":
			h.Chunks, err = intArg(d, 1)
		case "chunk_interval":
			h.ChunkInterval, err = durationArg(d)
		case "reply":
			h.Reply, err = oneArg(d)
		case "api_key":
			h.APIKey, err = oneArg(d)
		case "aws_credentials":
			var id, secret string
			if !d.AllArgs(&id, &secret) {
				return d.Errf("aws_credentials takes <access_key_id> <secret_access_key>")
			}
			h.AWSCredentials = &AWSCredentials{AccessKeyID: id, SecretAccessKey: secret}
		case "token_lifetime":
			h.TokenLifetime, err = durationArg(d)
			if err == nil && h.TokenLifetime == 0 {
				err = d.Errf("token_lifetime must be positive")
			}
		case "tool_call":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("tool_call takes <name> <arguments as a JSON object>")
			}
			if !json.Valid([]byte(args[1])) || args[1][0] != '{' {
				return d.Errf("tool_call: arguments %q are not a JSON object", args[1])
			}
			h.ToolCall = &ToolCall{Name: args[0], Arguments: json.RawMessage(args[1])}
		case "continuation":
			h.Continuation, err = oneArg(d)
			if err == nil && h.Continuation != ContinuationAccept && h.Continuation != ContinuationReject {
				err = d.Errf("unknown continuation %q (want accept or reject)", h.Continuation)
			}
		case "organization":
			h.Organization, err = oneArg(d)
		case "rate_limit":
			h.RateLimit, err = parseRateLimit(d)
		case "fault":
			var f Fault
			f, err = parseFault(d)
			h.Faults = append(h.Faults, f)
		default:
			return d.Errf("unrecognized subdirective %q", name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func parseRateLimit(d *caddyfile.Dispenser) (*RateLimit, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	rl := new(RateLimit)
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return nil, d.Errf("rate_limit: duplicate subdirective %q", name)
		}
		seen[name] = true
		var err error
		switch name {
		case "requests":
			rl.Requests, err = intArg(d, 0)
		case "tokens":
			rl.Tokens, err = intArg(d, 0)
		case "window":
			rl.Window, err = durationArg(d)
			if err == nil && rl.Window == 0 {
				err = d.Errf("window must be positive")
			}
		default:
			return nil, d.Errf("rate_limit: unrecognized subdirective %q", name)
		}
		if err != nil {
			return nil, err
		}
	}
	return rl, nil
}

func parseFault(d *caddyfile.Dispenser) (Fault, error) {
	var f Fault
	if !d.NextArg() {
		return f, d.Errf("fault needs a kind: rate_limit, status, hang, cut, error_event, keepalive, stall, malformed or slow")
	}
	f.Kind = d.Val()
	switch f.Kind {
	case FaultRateLimit, FaultStatus, FaultHang, FaultCut, FaultErrorEvent, FaultKeepAlive, FaultStall, FaultMalformed, FaultSlow:
	default:
		return f, d.Errf("unknown fault kind %q (want rate_limit, status, hang, cut, error_event, keepalive, stall, malformed or slow)", f.Kind)
	}
	if d.NextArg() {
		return f, d.ArgErr()
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name != "header" {
			if seen[name] {
				return f, d.Errf("fault %s: duplicate subdirective %q", f.Kind, name)
			}
			seen[name] = true
		}
		var err error
		switch name {
		case "every":
			f.Every, err = intArg(d, 1)
		case "from":
			f.From, err = durationArg(d)
		case "for":
			f.For, err = durationArg(d)
		case "status":
			f.Status, err = intArg(d, 100)
			if err == nil && f.Status > 599 {
				err = d.Errf("status must be 100-599, got %d", f.Status)
			}
		case "header":
			var field, value string
			if !d.AllArgs(&field, &value) {
				return f, d.ArgErr()
			}
			if f.Headers == nil {
				f.Headers = make(http.Header)
			}
			f.Headers.Add(field, value)
		case "body":
			f.Body, err = oneArg(d)
		case "after":
			var n int
			n, err = intArg(d, 0)
			f.After = &n
		case "retry_delay":
			f.RetryDelay, err = durationArg(d)
		case "quota_id":
			f.QuotaID, err = oneArg(d)
		case "quota":
			f.Quota, err = oneArg(d)
			if err == nil && (f.Quota == "" || !knownQuota(f.Quota)) {
				err = d.Errf("fault %s: unknown quota %q (want requests, tokens, tokens_per_day, shared, per_minute or per_day)", f.Kind, f.Quota)
			}
		case "delay":
			if f.Kind != FaultSlow {
				return f, d.Errf("fault %s: delay is only used by slow faults", f.Kind)
			}
			f.Delay, err = durationArg(d)
			if err == nil && f.Delay == 0 {
				err = d.Errf("fault slow: delay must be positive")
			}
		default:
			return f, d.Errf("fault %s: unrecognized subdirective %q", f.Kind, name)
		}
		if err != nil {
			return f, err
		}
	}
	if f.Kind == FaultSlow && f.Delay == 0 {
		return f, d.Errf("fault slow needs a delay")
	}
	return f, nil
}

// oneArg returns the single argument of the current subdirective.
func oneArg(d *caddyfile.Dispenser) (string, error) {
	var v string
	if !d.AllArgs(&v) {
		return "", d.ArgErr()
	}
	return v, nil
}

// intArg parses the single argument of the current subdirective as an
// integer of at least minimum.
func intArg(d *caddyfile.Dispenser, minimum int) (int, error) {
	name := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.Errf("%s: bad number %q: %v", name, v, err)
	}
	if n < minimum {
		return 0, d.Errf("%s must be at least %d, got %d", name, minimum, n)
	}
	return n, nil
}

// durationArg parses the single argument of the current subdirective
// as a non-negative duration.
func durationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	name := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("%s: bad duration %q: %v", name, v, err)
	}
	if dur < 0 {
		return 0, d.Errf("%s must not be negative, got %s", name, time.Duration(dur))
	}
	return caddy.Duration(dur), nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*Handler)(nil)
)
