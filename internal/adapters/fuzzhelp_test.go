package adapters

import "encoding/json"

func jsonValid(b []byte) bool             { return json.Valid(b) }
func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
