// Package lint holds checks of the source's shape that go vet does not
// make, run as tests (go test ./internal/lint): no function of the core
// (internal/router, internal/capacity, internal/adapters, internal/api,
// internal/wire, provider) is longer than MaxFuncLines. It has no code of
// its own; nothing imports it.
package lint
