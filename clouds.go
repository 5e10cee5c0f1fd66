package llmrouter

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/clouds"
)

// The cloud provider types: Amazon Bedrock and Google Vertex AI, each with
// its cloud's own credentials (internal/clouds: the transports that sign
// or authorize each request).

func init() {
	caddy.RegisterModule(Bedrock{})
	caddy.RegisterModule(Vertex{})
}

// Bedrock is the provider type `bedrock`: Amazon Bedrock's runtime API in
// one AWS region (the wire formats: adapters.Bedrock). Anthropic's models
// go through InvokeModel with the Messages body, so that Anthropic clients
// keep their features; other models through Converse.
//
// Requests are signed with SigV4 (service "bedrock") by the AWS SDK for Go
// v2's signer, with the SDK's default credential chain: environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), the shared
// config and credentials files (Profile), web identity
// (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN), container and instance
// roles; credentials that expire are refreshed before they do. RoleARN
// assumes a role with them. Alternatively api_key is a Bedrock API key,
// sent as "Authorization: Bearer" instead of a signature (default: the
// AWS_BEARER_TOKEN_BEDROCK environment variable, as the SDK reads it).
// The router sends every request itself: no SDK retries, so the router
// sees every throttle and decides.
type Bedrock struct {
	ProviderConfig
	// Region is the AWS region, such as "us-east-1": the endpoint
	// (https://bedrock-runtime.<region>.amazonaws.com, unless base_url is
	// set) and the signature's scope. Default: the AWS configuration's
	// (AWS_REGION, the profile's region).
	Region string `json:"region,omitempty"`
	// Profile is the shared configuration profile the credentials and
	// region come from. Default: AWS_PROFILE, else "default".
	Profile string `json:"profile,omitempty"`
	// RoleARN is a role to assume (sts:AssumeRole) with the credentials
	// found; its temporary credentials are refreshed before they expire.
	RoleARN          string `json:"role_arn,omitempty"`
	adapters.Bedrock `json:"-"`
}

// CaddyModule returns the Caddy module information.
func (Bedrock) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: ProviderNamespace + ".bedrock", New: func() caddy.Module { return new(Bedrock) }}
}

// UnmarshalCaddyfile reads the provider block: the shared subdirectives
// (base_url and api_key optional) and `region`, `profile`, `role_arn`.
func (p *Bedrock) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	p.NoKey, p.DerivedBaseURL = true, true
	return ParseProviderBlock(d, &p.ProviderConfig, func(d *caddyfile.Dispenser) (bool, error) {
		switch d.Val() {
		case "region":
			return true, argInto(d, &p.Region)
		case "profile":
			return true, argInto(d, &p.Profile)
		case "role_arn":
			return true, argInto(d, &p.RoleARN)
		}
		return false, nil
	})
}

// Provision implements caddy.Provisioner. It loads the AWS configuration
// (no credentials are fetched until the first request). Errors: an
// unknown profile, no region.
func (p *Bedrock) Provision(ctx caddy.Context) error {
	p.NoKey, p.DerivedBaseURL = true, true
	repl := caddy.NewReplacer()
	region := strings.TrimSpace(repl.ReplaceKnown(p.Region, ""))
	profile := strings.TrimSpace(repl.ReplaceKnown(p.Profile, ""))
	role := strings.TrimSpace(repl.ReplaceKnown(p.RoleARN, ""))
	if p.APIKey == "" && os.Getenv("AWS_BEARER_TOKEN_BEDROCK") != "" {
		p.APIKey = "{env.AWS_BEARER_TOKEN_BEDROCK}"
	}
	// `api_key none` signs with SigV4 even when AWS_BEARER_TOKEN_BEDROCK
	// is set.
	bearer := p.APIKey != "" && !strings.EqualFold(strings.TrimSpace(p.APIKey), NoAPIKey)
	var awsCfg aws.Config
	if !bearer || region == "" {
		var err error
		if awsCfg, err = clouds.LoadAWS(ctx, region, profile); err != nil {
			return fmt.Errorf("bedrock: loading the AWS configuration: %v", err)
		}
		region = awsCfg.Region
	}
	if region == "" {
		return errors.New("bedrock: no region: set `region` (or AWS_REGION)")
	}
	if !clouds.Name.MatchString(region) {
		// It names the host the credentials go to.
		return fmt.Errorf("bedrock: region %q is not an AWS region (such as us-east-1)", region)
	}
	if p.BaseURL == "" {
		p.BaseURL = "https://bedrock-runtime." + region + ".amazonaws.com"
	}
	p.Account = "region=" + region
	if profile != "" {
		p.Account += ",profile=" + profile
	}
	if role != "" {
		p.Account += ",role=" + role
	}
	if err := p.ProviderConfig.Provision(ctx); err != nil {
		return err
	}
	p.Bedrock.Endpoint = p.ProviderEndpoint()
	if bearer {
		return nil
	}
	creds := awsCfg.Credentials
	if role != "" {
		creds = clouds.AssumeRole(awsCfg, role)
	}
	if creds == nil {
		return errors.New("bedrock: no AWS credentials provider")
	}
	failed := clouds.Failure(ctx.Logger(), "bedrock: cannot get AWS credentials to sign with (looked in the environment, the shared config and credentials files, web identity, the container and instance roles)")
	p.WrapTransport(func(rt http.RoundTripper) http.RoundTripper { return clouds.SigV4(rt, creds, region, failed) })
	return nil
}

// Vertex is the provider type `vertex`: Google Vertex AI's publisher
// models in one project and location (the wire formats: adapters.Vertex):
// Anthropic's models (claude-*) through rawPredict with the Messages body,
// so that Anthropic clients keep their features; Google's (gemini-*)
// through generateContent.
//
// Requests carry an OAuth access token (scope cloud-platform) from
// Google's own Go auth library (cloud.google.com/go/auth), found by
// Application Default Credentials: CredentialsFile, else
// GOOGLE_APPLICATION_CREDENTIALS (a service account's JSON key, a workload
// identity federation configuration), else gcloud's application default
// credentials, else the metadata server (GCE, GKE workload identity, Cloud
// Run). Tokens come from the token endpoint the credentials name, are
// cached, and refreshed before they expire.
type Vertex struct {
	ProviderConfig
	// Project is the Google Cloud project id. Required.
	Project string `json:"project,omitempty"`
	// Region is the Vertex AI location, such as "us-east5", or "global":
	// the endpoint (https://<region>-aiplatform.googleapis.com/v1, or
	// https://aiplatform.googleapis.com/v1 for global, unless base_url is
	// set) and the path. Required.
	Region string `json:"region,omitempty"`
	// CredentialsFile is a credentials JSON file (a service account key,
	// an external account configuration). Default: Application Default
	// Credentials.
	CredentialsFile string `json:"credentials_file,omitempty"`
	adapters.Vertex `json:"-"`
}

// CaddyModule returns the Caddy module information.
func (Vertex) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: ProviderNamespace + ".vertex", New: func() caddy.Module { return new(Vertex) }}
}

// UnmarshalCaddyfile reads the provider block: the shared subdirectives
// (base_url optional, no api_key) and `project`, `region`,
// `credentials_file`.
func (p *Vertex) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	p.NoKey, p.DerivedBaseURL = true, true
	err := ParseProviderBlock(d, &p.ProviderConfig, func(d *caddyfile.Dispenser) (bool, error) {
		switch d.Val() {
		case "project":
			return true, argInto(d, &p.Project)
		case "region":
			return true, argInto(d, &p.Region)
		case "credentials_file":
			return true, argInto(d, &p.CredentialsFile)
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	if err := p.validateVertex(); err != nil {
		return d.Errf("%v", err)
	}
	return nil
}

func (p *Vertex) validateVertex() error {
	switch {
	case p.Project == "":
		return errors.New("vertex: needs a project (the Google Cloud project id)")
	case p.Region == "":
		return errors.New("vertex: needs a region (the Vertex AI location, such as us-east5, or global)")
	case p.APIKey != "":
		return errors.New("vertex: authenticates with Google credentials (credentials_file or Application Default Credentials), not an api_key")
	}
	return nil
}

// Provision implements caddy.Provisioner. It finds the Google credentials
// (no token is fetched until the first request). Errors: no project or
// region, an api_key, no credentials found, a credentials file that
// cannot be read.
func (p *Vertex) Provision(ctx caddy.Context) error {
	p.NoKey, p.DerivedBaseURL = true, true
	if err := p.validateVertex(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	project := strings.TrimSpace(repl.ReplaceKnown(p.Project, ""))
	region := strings.TrimSpace(repl.ReplaceKnown(p.Region, ""))
	file := strings.TrimSpace(repl.ReplaceKnown(p.CredentialsFile, ""))
	if project == "" || region == "" {
		return errors.New("vertex: project and region must not be empty once their placeholders are replaced")
	}
	if !clouds.Name.MatchString(region) {
		// It names the host the tokens go to.
		return fmt.Errorf("vertex: region %q is not a Vertex AI location (such as us-east5, or global)", region)
	}
	if !clouds.GCPProject.MatchString(project) {
		return fmt.Errorf("vertex: project %q is not a Google Cloud project id", project)
	}
	if p.BaseURL == "" {
		if region == "global" {
			p.BaseURL = "https://aiplatform.googleapis.com/v1"
		} else {
			p.BaseURL = "https://" + region + "-aiplatform.googleapis.com/v1"
		}
	}
	p.Account = "project=" + project + ",region=" + region
	if file != "" {
		p.Account += ",credentials=" + file
	}
	if err := p.ProviderConfig.Provision(ctx); err != nil {
		return err
	}
	p.Vertex.Endpoint, p.Vertex.Project, p.Vertex.Location = p.ProviderEndpoint(), project, region
	creds, err := clouds.GoogleCredentials(file)
	switch {
	case err != nil && file != "":
		return fmt.Errorf("vertex: reading credentials_file %s (a service account key or an external account configuration, JSON): %v", file, err)
	case err != nil:
		return fmt.Errorf("vertex: finding Google credentials: %v (looked for GOOGLE_APPLICATION_CREDENTIALS, gcloud's application_default_credentials.json, the metadata server of Google Cloud; or set credentials_file)", err)
	}
	rt, err := clouds.GoogleTokens(p.transport, creds,
		clouds.Failure(ctx.Logger(), "vertex: cannot get a Google access token (from the token endpoint or metadata server the credentials name)"))
	if err != nil {
		return fmt.Errorf("vertex: %v", err)
	}
	p.WrapTransport(func(http.RoundTripper) http.RoundTripper { return rt })
	return nil
}

// Interface guards
var (
	_ ProviderModule        = (*Bedrock)(nil)
	_ ProviderModule        = (*Vertex)(nil)
	_ caddy.Provisioner     = (*Bedrock)(nil)
	_ caddy.Provisioner     = (*Vertex)(nil)
	_ caddyfile.Unmarshaler = (*Bedrock)(nil)
	_ caddyfile.Unmarshaler = (*Vertex)(nil)
)
