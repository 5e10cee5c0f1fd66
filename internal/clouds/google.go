package clouds

import (
	"net/http"
	"regexp"

	"cloud.google.com/go/auth"
	"cloud.google.com/go/auth/credentials"
	"cloud.google.com/go/auth/httptransport"
)

// GCPProject is what a Google Cloud project id may be: lower-case
// letters, digits and hyphens, or a domain-scoped one
// ("example.com:my-project").
var GCPProject = regexp.MustCompile(`^([a-z0-9][a-z0-9.-]*:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$`)

// VertexScope is the OAuth scope of Vertex AI's API.
const VertexScope = "https://www.googleapis.com/auth/cloud-platform"

// GoogleCredentials finds the Google credentials of scope VertexScope by
// Application Default Credentials: file when not empty (a service
// account's JSON key, an external account configuration), else
// GOOGLE_APPLICATION_CREDENTIALS, else gcloud's application default
// credentials, else the metadata server (GCE, GKE workload identity,
// Cloud Run). No token is fetched.
func GoogleCredentials(file string) (*auth.Credentials, error) {
	return credentials.DetectDefault(&credentials.DetectOptions{
		Scopes: []string{VertexScope},
		//lint:ignore SA1019 the file is the operator's own (credentials_file), of any type Google's ADC takes; its deprecation warns of files from an untrusted source
		CredentialsFile: file,
	})
}

// GoogleTokens returns a transport that sends each request through base
// with an access token of creds (Google's authorizing transport: tokens
// from the token endpoint the credentials name, cached, refreshed before
// they expire). A failure to get a token is that attempt's error,
// through failed (see Failure).
func GoogleTokens(base http.RoundTripper, creds *auth.Credentials, failed func(error) error) (http.RoundTripper, error) {
	client := &http.Client{Transport: base}
	if err := httptransport.AddAuthorizationMiddleware(client, creds); err != nil {
		return nil, err
	}
	return &tokenTransport{base: client.Transport, creds: creds, failed: failed}, nil
}

// tokenTransport is Google's authorizing transport (base), after a look
// at the token it will use: a failure to get one is told through failed.
// (The token is cached: base finds it so.)
type tokenTransport struct {
	base   http.RoundTripper
	creds  *auth.Credentials
	failed func(error) error
}

// RoundTrip implements http.RoundTripper.
func (t *tokenTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if _, err := t.creds.Token(req.Context()); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, t.failed(err)
	}
	return t.base.RoundTrip(req)
}
