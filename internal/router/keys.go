package router

// Keys are what a client's request names its conversation and its prompt
// cache by, as its client API's Parse read them from the body; "" when it
// names none. The router reads neither: the handler's affinity does
// (which deployment served the conversation, or the cache, last: Prefer).
type Keys struct {
	// Cache is the client's own key of its prompt cache (OpenAI's
	// prompt_cache_key, by which OpenAI routes its cache).
	Cache string
	// Conversation is the key of its conversation: its prompt_cache_key,
	// else its user, else its metadata.user_id.
	Conversation string
}
