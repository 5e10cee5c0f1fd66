// Command caddy is a development build of Caddy: the standard modules plus
// llm_router and llm_mock. Production builds use xcaddy (see README.md).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/llmrouter/caddy-llm-router"
	_ "github.com/llmrouter/caddy-llm-router/mockllm"
)

func main() {
	caddycmd.Main()
}
