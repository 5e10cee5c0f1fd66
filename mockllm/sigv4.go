package mockllm

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Authentication of the bedrock dialect: a Bedrock API key (Bearer) or
// an AWS Signature Version 4, checked by signing the request again with
// the AWS SDK's signer, as AWS does. Nothing here logs a key, a secret
// or a signature.

// AWSCredentials are the AWS credentials a bedrock mock accepts
// signatures of (Handler.AWSCredentials).
type AWSCredentials struct {
	// AccessKeyID is the access key id, the first part of the
	// signature's Credential. Required.
	AccessKeyID string `json:"access_key_id"`
	// SecretAccessKey is the secret the signature is made with.
	// Required.
	SecretAccessKey string `json:"secret_access_key"`
}

// sigV4Signer signs requests again to check their signatures; it caches
// the signing keys it derives.
var sigV4Signer = v4.NewSigner()

// sigV4Algorithm starts an Authorization header of SigV4.
const sigV4Algorithm = "AWS4-HMAC-SHA256"

// amzDateFormat is the format of X-Amz-Date.
const amzDateFormat = "20060102T150405Z"

// sigV4 is a parsed SigV4 Authorization header.
type sigV4 struct {
	accessKeyID   string
	date          string // yyyymmdd of the credential scope
	region        string
	service       string
	signedHeaders []string // lower case, as sent
	signature     string   // hex
}

//lint:ignore ST1005 AWS's own message, word for word (what an SDK shows its user)
var errNotSigV4 = errors.New("Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' parameters of " + sigV4Algorithm + ".")

// parseSigV4 parses "AWS4-HMAC-SHA256 Credential=<akid>/<date>/<region>/
// <service>/aws4_request, SignedHeaders=a;b, Signature=<hex>".
func parseSigV4(authz string) (sigV4, error) {
	var s sigV4
	rest, ok := strings.CutPrefix(authz, sigV4Algorithm+" ")
	if !ok {
		return s, errNotSigV4
	}
	var cred, signed string
	for part := range strings.SplitSeq(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "Credential":
			cred = v
		case "SignedHeaders":
			signed = v
		case "Signature":
			s.signature = v
		}
	}
	scope := strings.Split(cred, "/")
	if len(scope) != 5 || scope[4] != "aws4_request" || scope[0] == "" || signed == "" || s.signature == "" {
		return s, errNotSigV4
	}
	s.accessKeyID, s.date, s.region, s.service = scope[0], scope[1], scope[2], scope[3]
	s.signedHeaders = strings.Split(signed, ";")
	return s, nil
}

// bedrockAuth checks a bedrock request's credentials: "Authorization:
// Bearer <APIKey>" or a SigV4 signature of AWSCredentials. key is the
// Bearer token sent, body the request's body.
func (h *Handler) bedrockAuth(r *http.Request, key string, body []byte) authResult {
	refuse := func(errType, msg string) authResult { return authResult{denied: true, errType: errType, msg: msg} }
	authz := r.Header.Get("Authorization")
	switch {
	case authz == "":
		return refuse("MissingAuthenticationTokenException", "Missing Authentication Token")
	case strings.HasPrefix(authz, "Bearer "):
		if h.apiKey != "" && keyEqual(key, h.apiKey) {
			return authResult{}
		}
		return refuse("UnrecognizedClientException", "The security token included in the request is invalid.")
	}
	sig, err := parseSigV4(authz)
	if err != nil {
		return refuse("IncompleteSignatureException", err.Error())
	}
	if h.awsKey.AccessKeyID == "" || !keyEqual(sig.accessKeyID, h.awsKey.AccessKeyID) {
		return refuse("UnrecognizedClientException", "The security token included in the request is invalid.")
	}
	if sig.service != "bedrock" {
		return refuse("InvalidSignatureException", "Credential should be scoped to correct service: 'bedrock'. ")
	}
	t, err := time.Parse(amzDateFormat, r.Header.Get("X-Amz-Date"))
	if err != nil {
		return refuse("IncompleteSignatureException", "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.")
	}
	sum := sha256.Sum256(body)
	payloadHash := hex.EncodeToString(sum[:])
	if x := r.Header.Get("X-Amz-Content-Sha256"); x != "" && x != payloadHash {
		return refuse("InvalidSignatureException", bedrockSignatureDiffer)
	}
	if !verifySigV4(r, sig, h.awsKey.SecretAccessKey, payloadHash, t) {
		return refuse("InvalidSignatureException", bedrockSignatureDiffer)
	}
	return authResult{}
}

// verifySigV4 signs again, with the SDK's signer and secret, the request
// r was signed as: its method, escaped path and query as received (before
// any Caddy rewrite), and its signed headers only (the client may add
// others after signing), and reports whether the signature is sig's.
func verifySigV4(r *http.Request, sig sigV4, secret, payloadHash string, t time.Time) bool {
	u := r.URL
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && orig.URL != nil {
		u = orig.URL
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	// Opaque carries the escaped path as received: the signer takes it
	// as it is, then escapes it again as AWS does for services but S3.
	req := &http.Request{
		Method: r.Method,
		URL:    &url.URL{Scheme: scheme, Host: r.Host, Opaque: "//" + r.Host + u.EscapedPath(), RawQuery: u.RawQuery},
		Host:   r.Host,
		Header: make(http.Header, len(sig.signedHeaders)),
	}
	var sessionToken string
	for _, name := range sig.signedHeaders {
		switch name {
		case "host":
			// r.Host
		case "content-length":
			req.ContentLength = r.ContentLength
		default:
			if vs := r.Header.Values(name); len(vs) > 0 {
				req.Header[http.CanonicalHeaderKey(name)] = vs
			}
			if name == "x-amz-security-token" {
				sessionToken = r.Header.Get(name)
			}
		}
	}
	creds := aws.Credentials{AccessKeyID: sig.accessKeyID, SecretAccessKey: secret, SessionToken: sessionToken}
	if err := sigV4Signer.SignHTTP(r.Context(), creds, req, payloadHash, sig.service, sig.region, t); err != nil {
		return false
	}
	want, err := parseSigV4(req.Header.Get("Authorization"))
	return err == nil && hmac.Equal([]byte(want.signature), []byte(sig.signature))
}
