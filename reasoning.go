package llmrouter

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/llmrouter/caddy-llm-router/internal/api"
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
	// never saw: see api.InvalidEncryptedContent).
	MintedMax = 100_000
	// MintedTTL is how long an encrypted item is remembered since it was
	// last seen.
	MintedTTL = 30 * 24 * time.Hour
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
	if enc := api.EncryptedOf(item); enc != "" {
		minted().Add(mintKeyOf(enc), h.meta[d].org)
	}
}

// bindReasoning tells the router what of a Responses request only one
// organization can read: its input items with encrypted_content. The
// deployments of the organization that made the last of them it knows
// take it while one can serve it; another is sent the input without the
// items of other organizations (api.StripEncrypted); a provider's
// invalid_encrypted_content (an item the router never saw made) sends it
// once more without any.
func (h *Handler) bindReasoning(req *router.Request) {
	encrypted := api.EncryptedItems(req)
	if len(encrypted) == 0 {
		return
	}
	makers := map[mintKey]string{} // of the items it knows
	last := ""
	for _, enc := range encrypted {
		if org, ok := minted().Get(mintKeyOf(enc)); ok {
			makers[mintKeyOf(enc)], last = org, org
		}
	}
	b := &router.Bound{
		Strip: func(body []byte, d *router.Deployment, all bool) ([]byte, bool) {
			org := h.meta[d].org
			return api.StripEncrypted(body, func(enc string) bool {
				maker, ok := makers[mintKeyOf(enc)]
				return all || ok && maker != org
			})
		},
		// The provider could not read an item the router never saw made:
		// the request goes once more without any.
		Refused: func(obs provider.Observation) bool { return obs.Code == api.InvalidEncryptedContent },
	}
	if last != "" {
		b.Reads = func(d *router.Deployment) bool { return h.meta[d].org == last }
	}
	req.Bound = b
}
