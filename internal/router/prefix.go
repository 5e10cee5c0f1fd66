package router

import (
	"hash/fnv"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// A request's prompt-cache prefix. Providers cache a prompt's beginning:
// Anthropic up to and including a block marked cache_control, in the
// order tools, system, messages, and on a later request reads the longest
// cached prefix it finds at a marker or up to 20 blocks before it
// (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching);
// OpenAI caches prompts of 1,024 tokens or more automatically, routed by
// a hash of their first 256 tokens or so and the prompt_cache_key
// (https://platform.openai.com/docs/guides/prompt-caching). The router
// hashes the same parts (tools, system, then each message's content
// blocks, each with its role) as the client wrote them, without their
// cache_control markers (a marker that moves on to the next turn's last
// message leaves the content cached before it), so that the hashes are
// stable across a conversation's turns, whatever else of the body
// changes.

const (
	// cacheLookback is how many parts before the last cache_control
	// marker a provider looks for a cached prefix at (Anthropic: 20).
	cacheLookback = 20
	// PrefixHeadBytes is the long prefix that names a prompt without a
	// cache marker (HeadKey): its first 1,024 bytes of parts, about the
	// 256 tokens OpenAI routes its cache by, for a prompt of at least
	// that many.
	PrefixHeadBytes = 1024
)

// cachePrefix is what CachePrefixes and HeadKey return, computed once.
type cachePrefix struct {
	// ends are the hashes of the prompt up to the end of each part from
	// cacheLookback before the last marker to the last one (shortest
	// first), and at each marker; nil without a marker.
	ends []uint64
	// head hashes the first PrefixHeadBytes bytes of the parts (0: the
	// parts are shorter).
	head uint64
}

// CachePrefixes returns stable hashes of the request's prompt up to the
// end of each of its parts that a provider may have cached (see
// cacheLookback), shortest first; the last one is the prompt up to and
// including its last cache_control marker. Nil for a request without a
// marker, or of a format other than Chat Completions and Messages.
func (req *Request) CachePrefixes() []uint64 { return req.prefix().ends }

// HeadKey returns a stable hash of the first PrefixHeadBytes bytes of the
// request's prompt parts, 0 when they are shorter (or the format is
// another): requests that share it share a long prefix a provider caches.
func (req *Request) HeadKey() uint64 { return req.prefix().head }

func (req *Request) prefix() *cachePrefix {
	if p := req.prefixes.Load(); p != nil {
		return p
	}
	p := &cachePrefix{}
	if req.Request != nil && (req.Format == provider.Messages || req.Format == provider.Chat) {
		p = hashPrefix(req.Body)
	}
	req.prefixes.Store(p)
	return p
}

// hashPrefix walks body's parts in order (tools, system, messages), each
// hashed after the ones before it.
func hashPrefix(body []byte) *cachePrefix {
	h := fnv.New64a()
	var ends []uint64
	var marks []int // indexes in ends of the parts marked cache_control
	size, head := 0, uint64(0)
	part := func(role string, raw []byte) {
		raw, marked := jsonbody.Without(raw, "cache_control") // the content, not whether it is marked
		h.Write([]byte(role))
		h.Write(raw)
		h.Write([]byte{0})
		if head == 0 && size+len(raw) >= PrefixHeadBytes {
			// the head: the parts so far and the start of this one
			head = headOf(ends, raw[:PrefixHeadBytes-size])
		}
		size += len(raw)
		ends = append(ends, h.Sum64())
		if marked {
			marks = append(marks, len(ends)-1)
		}
	}
	for _, key := range []string{"tools", "system", "messages"} {
		s, e, _ := jsonbody.FindMember(body, key)
		if s < 0 {
			continue
		}
		eachPart(body[s:e], key == "messages", part)
	}
	p := &cachePrefix{head: head}
	if len(marks) > 0 {
		last := marks[len(marks)-1]
		for _, m := range marks {
			if m < last-cacheLookback {
				p.ends = append(p.ends, ends[m])
			}
		}
		p.ends = append(p.ends, ends[max(last-cacheLookback, 0):last+1]...)
	}
	return p
}

// headOf hashes the parts before (the running hash's last sum, ends'
// last) and start, the beginning of the next one; never 0.
func headOf(ends []uint64, start []byte) uint64 {
	g := fnv.New64a()
	if len(ends) > 0 {
		last := ends[len(ends)-1]
		for i := range 8 {
			g.Write([]byte{byte(last >> (8 * i))})
		}
	}
	g.Write(start)
	return g.Sum64() | 1
}

// eachPart calls part with each part of a tools, system or messages
// value: a string whole, an array's elements, and for messages each
// message's content blocks, the first one with its role (a message whose
// content is a string is one part).
func eachPart(v []byte, messages bool, part func(role string, raw []byte)) {
	if len(v) == 0 || v[0] != '[' {
		part("", v)
		return
	}
	_ = jsonbody.EachElement(v, func(s, e int) bool {
		el := v[s:e]
		cs, ce := -1, -1
		if messages {
			cs, ce, _ = jsonbody.FindMember(el, "content")
		}
		if cs < 0 || el[cs] != '[' {
			part("", el)
			return true
		}
		role, _ := jsonbody.GetString(el, "role")
		role += "\x00"
		_ = jsonbody.EachElement(el[cs:ce], func(bs, be int) bool {
			part(role, el[cs+bs:cs+be])
			role = ""
			return true
		})
		return true
	})
}
