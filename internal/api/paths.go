package api

import (
	"net/http"
	"strings"
)

// The paths the router serves, once: ForPath routes by them, the handler's
// 404 for any other path lists them (Served), and the docs' table of them
// is made from them (EndpointsTable, in docs/endpoints.md).

// Endpoint is one kind of request the router answers: methods on a path,
// matched by the path's end under whatever prefix the handler's matcher
// takes (/v1/chat/completions, /openai/v1/chat/completions), a trailing
// slash ignored.
type Endpoint struct {
	// Methods are the methods it answers.
	Methods []string
	// Path is the path's end; {id} stands for a model group's name or a
	// stored response's id.
	Path string
	// What says what it is, for the docs.
	What string
	// API is the client API that answers a POST to Path (ForPath); nil
	// for the router's other answers.
	API API
	// Upgrade: a GET that asks to upgrade to a WebSocket.
	Upgrade bool
}

// The paths of the router's answers that are no client API's POST.
const (
	CountTokensPath = "/messages/count_tokens" // Anthropic's token counting: its own loop (the handler's)
	ModelsPath      = "/models"                // GET: the model groups; ModelsPath + "/{id}": one
	ResponsePath    = "/responses/{id}"        // a stored (background) response; its operations follow it
)

// Endpoints are what the router serves, in the order ForPath matches them
// (chat/completions before completions) and the docs list them.
var Endpoints = []Endpoint{
	{Methods: post, Path: "/chat/completions", What: "OpenAI Chat Completions, streamed or not", API: Chat{}},
	{Methods: post, Path: "/responses", What: "OpenAI Responses, streamed or not, background or not", API: Responses{}},
	{Methods: post, Path: "/messages", What: "Anthropic Messages, streamed or not", API: Messages{}},
	{Methods: post, Path: CountTokensPath, What: "Anthropic's token counting"},
	{Methods: post, Path: "/embeddings", What: "OpenAI embeddings", API: Embeddings{}},
	{Methods: post, Path: "/completions", What: "OpenAI legacy completions", API: Completions{}},
	{Methods: get, Path: ModelsPath, What: "the model groups (OpenAI's model list)"},
	{Methods: get, Path: ModelsPath + "/{id}", What: "one model group"},
	{Methods: []string{http.MethodGet, http.MethodDelete}, Path: ResponsePath, What: "a background response: poll it (its events with ?stream=true), delete it"},
	{Methods: post, Path: ResponsePath + "/cancel", What: "cancel a background response"},
	{Methods: get, Path: ResponsePath + "/input_items", What: "a background response's input items"},
	{Methods: get, Path: "/responses", What: "the Responses API's WebSocket mode", Upgrade: true},
}

var post, get = []string{http.MethodPost}, []string{http.MethodGet}

// ForPath returns the API that answers POSTs to path (matched by its end,
// so that any prefix works), or nil.
func ForPath(path string) API {
	path = strings.TrimSuffix(path, "/")
	for i := range Endpoints {
		if e := &Endpoints[i]; e.API != nil && strings.HasSuffix(path, e.Path) {
			return e.API
		}
	}
	return nil
}

// Request is how the docs and errors name the endpoint's requests:
// "POST .../chat/completions", "GET, DELETE .../responses/{id}", "GET
// .../responses (WebSocket upgrade)".
func (e *Endpoint) Request() string {
	s := strings.Join(e.Methods, ", ") + " ..." + e.Path
	if e.Upgrade {
		s += " (WebSocket upgrade)"
	}
	return s
}

// Served lists every endpoint's Request, for the 404 of any other path.
func Served() string {
	out := make([]string, len(Endpoints))
	for i := range Endpoints {
		out[i] = Endpoints[i].Request()
	}
	return strings.Join(out, "; ")
}

// EndpointsTable is the Markdown table of the endpoints (docs/endpoints.md).
func EndpointsTable() string {
	var b strings.Builder
	b.WriteString("| request | what |\n|---|---|\n")
	for i := range Endpoints {
		b.WriteString("| `" + Endpoints[i].Request() + "` | " + Endpoints[i].What + " |\n")
	}
	return b.String()
}
