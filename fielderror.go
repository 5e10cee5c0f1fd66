package llmrouter

import (
	"errors"
	"fmt"
	"slices"
)

// fieldError is a validation error of one configuration value, named by
// its path in the handler's JSON (["models", "m", "deployments", "0",
// "tier"]): the validate functions return them, Provision shows their
// message, and the Caddyfile parser puts the file and line that set the
// value after it (positions.locate). The path's segments are kept apart
// because model and provider names may hold dots.
type fieldError struct {
	path  []string
	label string // put before the cause's message: "model m: "
	err   error
}

func (e *fieldError) Error() string { return e.label + e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// fieldErr is the error of the value at path, relative to the struct
// whose validate reports it.
func fieldErr(path string, format string, args ...any) error {
	return &fieldError{path: []string{path}, err: fmt.Errorf(format, args...)}
}

// within places err, a validation error of a nested value, under path
// (its segments relative to the caller), its message after label; nil
// stays nil.
func within(err error, label string, path ...string) error {
	if err == nil {
		return nil
	}
	fe := &fieldError{path: path, label: label, err: err}
	if inner := (*fieldError)(nil); errors.As(err, &inner) {
		fe.path = append(slices.Clone(path), inner.path...)
	}
	return fe
}

// fieldPath is the path of the value err names, nil when it names none.
func fieldPath(err error) []string {
	if fe := (*fieldError)(nil); errors.As(err, &fe) {
		return fe.path
	}
	return nil
}
