package clouds

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// ExpiryWindow is how long before temporary AWS credentials expire that
// they are replaced: a request signed just before expiry may reach
// Bedrock after it.
const ExpiryWindow = time.Minute

// refreshEarly has temporary credentials (a role's, an instance's, a web
// identity's) fetched anew ExpiryWindow before they expire.
func refreshEarly(o *aws.CredentialsCacheOptions) { o.ExpiryWindow = ExpiryWindow }

// LoadAWS loads the AWS SDK's default configuration: its region (region
// when not empty, else AWS_REGION or the profile's) and its credential
// chain (environment, shared config and credentials files of profile,
// default AWS_PROFILE or "default", web identity, container and instance
// roles), refreshed ExpiryWindow early. No credentials are fetched. An
// unknown profile is an error.
func LoadAWS(ctx context.Context, region, profile string) (aws.Config, error) {
	opts := []func(*config.LoadOptions) error{config.WithCredentialsCacheOptions(refreshEarly)}
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	if profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(profile))
	}
	return config.LoadDefaultConfig(ctx, opts...)
}

// AssumeRole returns the temporary credentials of role (an ARN), assumed
// with cfg's credentials (sts:AssumeRole, session name
// "caddy-llm-router") and refreshed ExpiryWindow before they expire.
func AssumeRole(cfg aws.Config, role string) aws.CredentialsProvider {
	return aws.NewCredentialsCache(stscreds.NewAssumeRoleProvider(sts.NewFromConfig(cfg), role,
		func(o *stscreds.AssumeRoleOptions) { o.RoleSessionName = "caddy-llm-router" }), refreshEarly)
}

// BedrockService is the SigV4 signing name of Bedrock's runtime API.
const BedrockService = "bedrock"

// SigV4 returns a transport that signs each request with AWS Signature
// Version 4 (service BedrockService, region) with creds just before base
// sends it; a request sent again is signed again. A failure to get
// credentials (none found, an expired session the chain cannot refresh,
// an unreachable instance role) is that attempt's error, through failed
// (see Failure).
func SigV4(base http.RoundTripper, creds aws.CredentialsProvider, region string, failed func(error) error) http.RoundTripper {
	return &sigV4Transport{base: base, creds: creds, signer: v4.NewSigner(), region: region, now: time.Now, failed: failed}
}

type sigV4Transport struct {
	base   http.RoundTripper
	creds  aws.CredentialsProvider
	signer *v4.Signer
	region string
	now    func() time.Time
	failed func(error) error // Failure
}

// RoundTrip implements http.RoundTripper.
func (t *sigV4Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		body, err = io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	creds, err := t.creds.Retrieve(req.Context())
	if err != nil {
		return nil, t.failed(err)
	}
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	out.ContentLength = int64(len(body))
	sum := sha256.Sum256(body)
	if err := t.signer.SignHTTP(req.Context(), creds, out, hex.EncodeToString(sum[:]), BedrockService, t.region, t.now()); err != nil {
		return nil, fmt.Errorf("bedrock: signing the request: %w", err)
	}
	return t.base.RoundTrip(out)
}

var _ http.RoundTripper = (*sigV4Transport)(nil)
