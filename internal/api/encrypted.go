package api

import (
	"bytes"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// A Responses item that carries encrypted_content (a reasoning item, with
// store: false and include ["reasoning.encrypted_content"], as Codex
// sends every turn; a compaction item) holds state that only the
// organization that produced it can decrypt:
// https://platform.openai.com/docs/guides/reasoning#encrypted-reasoning-items.
// The handler remembers which organization made each (reasoning.go);
// these read and strip them.

// InvalidEncryptedContent is OpenAI's error code for an encrypted item it
// cannot read ("The encrypted content gAAA...DQ== could not be
// verified.": https://github.com/openai/codex/issues/8145).
const InvalidEncryptedContent = "invalid_encrypted_content"

// EncryptedOf is an item's encrypted_content, "" when it has none.
func EncryptedOf(item []byte) string {
	enc, _ := jsonbody.GetString(item, "encrypted_content")
	return enc
}

// EncryptedItems returns the encrypted_content of each input item of a
// Responses request that carries one, in order; nil for any other
// request.
func EncryptedItems(req *router.Request) []string {
	if req.Format != provider.Responses || !bytes.Contains(req.Body, []byte(`"encrypted_content"`)) {
		return nil
	}
	var out []string
	eachInputItem(req.Body, func(item []byte) {
		if enc := EncryptedOf(item); enc != "" {
			out = append(out, enc)
		}
	})
	return out
}

// eachInputItem calls fn with each object of a Responses body's input
// array (none when input is a string).
func eachInputItem(body []byte, fn func(item []byte)) { eachObject(body, "input", fn) }

// eachObject calls fn with each object of the array that is obj's member
// name (none when the member is absent or no array; elements that are not
// objects skipped).
func eachObject(obj []byte, name string, fn func(item []byte)) {
	start, end, _ := jsonbody.FindMember(obj, name)
	if start < 0 || obj[start] != '[' {
		return
	}
	arr := obj[start:end]
	_ = jsonbody.EachElement(arr, func(s, e int) bool {
		if arr[s] == '{' {
			fn(arr[s:e])
		}
		return true
	})
}

// StripEncrypted returns a Responses body without the input items whose
// encrypted_content drop picks, and whether it removed any. Once it
// removes one, the reasoning items left without encrypted_content (they
// stand for a stored item of the organization that made it) go too, and
// the other items lose their ids (but an item_reference, which is one,
// and an encrypted item kept, which needs its own): an id names an item of that
// organization, and OpenAI refuses a function_call whose id pairs it with
// a reasoning item that is not there ("Item 'fc_...' of type
// 'function_call' was provided without its required 'reasoning' item").
// The rest of the conversation (messages, calls, their outputs) stays.
func StripEncrypted(body []byte, drop func(enc string) bool) ([]byte, bool) {
	var kept [][]byte
	dropped := false
	eachInputItem(body, func(item []byte) {
		if enc := EncryptedOf(item); enc != "" && drop(enc) {
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
		enc := EncryptedOf(item)
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
