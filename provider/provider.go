// Package provider is the contract between llm_router and a provider type:
// the error classes and rate-limit windows a provider type decodes from
// every answer (Observation), the server-sent events it reads, and the
// decoders of the dialects providers share (counts, resets, Retry-After,
// "try again in" hints).
//
// It imports neither Caddy nor the rest of this project.
package provider
