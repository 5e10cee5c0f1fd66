package llmrouter

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Reasoning affinity. A Responses item that carries encrypted_content
// (a reasoning item, with store: false and include
// ["reasoning.encrypted_content"], as Codex sends every turn; a compaction
// item of /responses/compact or of context_management) holds state that
// only the organization that produced it can decrypt:
// https://platform.openai.com/docs/guides/reasoning#encrypted-reasoning-items,
// https://platform.openai.com/docs/api-reference/responses/compact.
// Another organization answers 400 invalid_encrypted_content ("The
// encrypted content gAAA...DQ== could not be verified.":
// https://github.com/openai/codex/issues/8145). So the router remembers,
// per encrypted item it passes on (a hash of its encrypted_content), the
// organization of the deployment that made it; a request that carries
// such items goes to that organization while one of its deployments can
// serve it, and to another only without them (router.Bound).
const (
	// MintedMax bounds how many encrypted items are remembered; the least
	// recently seen are forgotten first (a forgotten item is one the router
	// never saw: see invalidEncryptedContent).
	MintedMax = 100_000
	// MintedTTL is how long an encrypted item is remembered since it was
	// last seen.
	MintedTTL = 30 * 24 * time.Hour
	// invalidEncryptedContent is OpenAI's error code for an encrypted item
	// it cannot read; the router then sends the request once more without
	// any encrypted item.
	invalidEncryptedContent = "invalid_encrypted_content"
	// maxOrganization bounds an organization name's length.
	maxOrganization = 128
)

// mintKey is an encrypted item's key: the first half of its
// encrypted_content's SHA-256.
type mintKey [16]byte

func mintKeyOf(enc string) mintKey {
	sum := sha256.Sum256([]byte(enc))
	return mintKey(sum[:16])
}

// minted outlives config reloads, as capacity states do: a value is the
// organization (ProviderConfig.organization) that made the item.
var minted = sync.OnceValue(func() *expirable.LRU[mintKey, string] {
	return expirable.NewLRU[mintKey, string](MintedMax, nil, MintedTTL)
})

// checkOrganization checks a configured organization name: empty (the
// credentials tell), or at most maxOrganization characters, none a space
// or a control character.
func checkOrganization(name string) error {
	if len(name) > maxOrganization || strings.IndexFunc(name, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return fmt.Errorf("organization %q: must be at most %d characters, without spaces or control characters", trimmed(name), maxOrganization)
	}
	return nil
}

func trimmed(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// organization names the account's provider organization: its
// Organization when configured; else a fingerprint of its credentials
// (the key, the credential headers, the OpenAI-Organization header that
// picks one of a key's organizations, the cloud account), so that
// providers sharing a key are one organization; a server that takes no
// credentials is one of its own per base_url. Never a secret.
func (c *ProviderConfig) organization() string {
	if c.Organization != "" {
		return "name|" + c.Organization
	}
	var parts []string
	if c.endpoint.APIKey != "" {
		parts = append(parts, "key="+c.endpoint.APIKey)
	}
	for name, vs := range c.endpoint.Header {
		if isCredential(name) || strings.EqualFold(name, "OpenAI-Organization") {
			for _, v := range vs {
				parts = append(parts, strings.ToLower(name)+"="+credentialOf(v))
			}
		}
	}
	if c.Account != "" {
		parts = append(parts, "account="+c.Account)
	}
	if len(parts) == 0 {
		parts = append(parts, "base_url="+c.endpoint.BaseURL)
	}
	slices.Sort(parts)
	sum := sha256.Sum256([]byte(strings.Join(parts, "\n")))
	return "credentials|" + hex.EncodeToString(sum[:8])
}

// noteMinted remembers the organization of d as the maker of an output
// item of a native Responses answer, when the item carries
// encrypted_content.
func (h *Handler) noteMinted(d *router.Deployment, item []byte) {
	if d == nil {
		return
	}
	if enc, _ := jsonbody.GetString(item, "encrypted_content"); enc != "" {
		minted().Add(mintKeyOf(enc), h.meta[d].org)
	}
}

// bindReasoning tells the router what of a Responses request only one
// organization can read: its input items with encrypted_content. The
// deployments of the organization that made the last of them it knows
// take it while one can serve it; another is sent the input without the
// items of other organizations (stripEncrypted); a provider's
// invalid_encrypted_content (an item the router never saw made) sends it
// once more without any.
func (h *Handler) bindReasoning(req *router.Request) {
	if req.Format != provider.Responses || !bytes.Contains(req.Body, []byte(`"encrypted_content"`)) {
		return
	}
	makers := map[mintKey]string{} // of the items it knows
	last, any := "", false
	eachInputItem(req.Body, func(item []byte) {
		enc, _ := jsonbody.GetString(item, "encrypted_content")
		if enc == "" {
			return
		}
		any = true
		if org, ok := minted().Get(mintKeyOf(enc)); ok {
			makers[mintKeyOf(enc)], last = org, org
		}
	})
	if !any {
		return
	}
	b := &router.Bound{
		Strip: func(body []byte, d *router.Deployment, all bool) ([]byte, bool) {
			org := h.meta[d].org
			return stripEncrypted(body, func(enc string) bool {
				maker, ok := makers[mintKeyOf(enc)]
				return all || ok && maker != org
			})
		},
		Refused: func(obs provider.Observation) bool { return obs.Code == invalidEncryptedContent },
	}
	if last != "" {
		b.Reads = func(d *router.Deployment) bool { return h.meta[d].org == last }
	}
	req.Bound = b
}

// eachInputItem calls fn with each object of a Responses body's input
// array (none when input is a string).
func eachInputItem(body []byte, fn func(item []byte)) {
	start, end, _ := jsonbody.FindMember(body, "input")
	if start < 0 || body[start] != '[' {
		return
	}
	input := body[start:end]
	_ = jsonbody.EachElement(input, func(s, e int) bool {
		if input[s] == '{' {
			fn(input[s:e])
		}
		return true
	})
}

// stripEncrypted returns a Responses body without the input items whose
// encrypted_content drop picks, and whether it removed any. Once it
// removes one, the reasoning items left without encrypted_content (they
// stand for a stored item of the organization that made it) go too, and
// the other items lose their ids (but an item_reference, which is one,
// and an encrypted item kept, which needs its own): an id names an item of that
// organization, and OpenAI refuses a function_call whose id pairs it with
// a reasoning item that is not there ("Item 'fc_...' of type
// 'function_call' was provided without its required 'reasoning' item").
// The rest of the conversation (messages, calls, their outputs) stays.
func stripEncrypted(body []byte, drop func(enc string) bool) ([]byte, bool) {
	var kept [][]byte
	dropped := false
	eachInputItem(body, func(item []byte) {
		if enc, _ := jsonbody.GetString(item, "encrypted_content"); enc != "" && drop(enc) {
			dropped = true
			return
		}
		kept = append(kept, item)
	})
	if !dropped {
		return body, false
	}
	input := []byte{'['}
	for _, item := range kept {
		typ, _ := jsonbody.GetString(item, "type")
		enc, _ := jsonbody.GetString(item, "encrypted_content")
		switch {
		case typ == "reasoning" && enc == "":
			continue
		case enc == "" && typ != "item_reference":
			item, _ = jsonbody.Without(item, "id")
		}
		if len(input) > 1 {
			input = append(input, ',')
		}
		input = append(input, item...)
	}
	out, err := jsonbody.SetRaw(body, "input", append(input, ']'))
	if err != nil {
		return body, false // parsed before: not reached
	}
	return out, true
}
