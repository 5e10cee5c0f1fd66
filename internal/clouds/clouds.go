// Package clouds holds the credentials of the cloud provider types, as
// transports that authorize each request just before it goes out: Amazon
// Bedrock's SigV4 signatures (the AWS SDK for Go v2's credential chain
// and signer) and Google Vertex AI's OAuth access tokens (Google's
// cloud.google.com/go/auth). The root's provider modules (bedrock,
// vertex) configure them; nothing here knows Caddy.
package clouds

import (
	"fmt"
	"regexp"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/redact"
)

// Name is what a cloud's region or location may be: a DNS label
// (us-east-1, us-east5, global), as it is part of the endpoint's host.
var Name = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Failure returns what a cloud transport calls when it cannot get
// credentials for a request: the attempt fails with the error returned
// (the router takes it for a transport error: it fails over, and tries
// the deployment again after its backoff), and the operator is told at
// error level, at most once a minute per call of Failure, what failed.
// msg says where the credentials were looked for; nothing of them is
// logged (err redacted: see package redact).
func Failure(logger *zap.Logger, msg string) func(err error) error {
	var last atomic.Int64
	return func(err error) error {
		now := time.Now().UnixNano()
		if prev := last.Load(); now-prev >= int64(time.Minute) && last.CompareAndSwap(prev, now) {
			logger.Error(msg, zap.String("error", redact.String(err.Error(), nil))) // a token endpoint's answer may hold one
		}
		return fmt.Errorf("%s: %w", msg, err)
	}
}
