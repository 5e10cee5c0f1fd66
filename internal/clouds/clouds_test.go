package clouds

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmrouter/caddy-llm-router/mockllm"
)

// A cloud type that cannot get credentials fails the attempt (the router
// fails over) and tells the operator at error level, at most once a
// minute, without a credential.
func TestCredentialsFailureIsToldOnceAMinute(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	failed := Failure(zap.New(core), "bedrock: cannot get AWS credentials to sign with")
	for range 3 {
		err := failed(errors.New("no EC2 IMDS role found"))
		if err == nil || !strings.Contains(err.Error(), "cannot get AWS credentials to sign with: no EC2 IMDS role found") {
			t.Errorf("error %v", err)
		}
	}
	if all := logs.All(); len(all) != 1 || all[0].Level != zapcore.ErrorLevel || all[0].Message != "bedrock: cannot get AWS credentials to sign with" {
		t.Errorf("logged %+v", all)
	}
}

// SigV4 signs each request, a resent one anew, so that llm_mock's bedrock
// dialect verifies it with the AWS SDK's signer; a wrong secret does not
// verify; credentials it cannot get fail the request through failed,
// nothing sent.
func TestSigV4SignsEachRequest(t *testing.T) {
	m := &mockllm.Handler{Dialect: "bedrock", Reply: "Signed.",
		AWSCredentials: &mockllm.AWSCredentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: "the-secret"}}
	if err := m.Setup(); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.HTTPHandler())
	defer srv.Close()
	creds := func(secret string) aws.CredentialsProvider {
		return aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: secret}, nil
		})
	}
	send := func(rt http.RoundTripper) (int, error) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/model/amazon.nova-lite-v1:0/converse",
			strings.NewReader(`{"messages":[{"role":"user","content":[{"text":"hi"}]}]}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	var failures atomic.Int64
	failed := func(err error) error { failures.Add(1); return err }
	rt := SigV4(http.DefaultTransport, creds("the-secret"), "us-east-1", failed)
	for range 2 {
		if code, err := send(rt); code != 200 || err != nil {
			t.Errorf("signed: %d %v", code, err)
		}
	}
	if st := m.Stats(); st.AuthAccepted != 2 || st.LastPrincipal != "AKIDEXAMPLE" || !strings.Contains(st.LastAuthorization, "/us-east-1/bedrock/aws4_request") {
		t.Errorf("the mock saw %+v", st)
	}
	if code, _ := send(SigV4(http.DefaultTransport, creds("not-the-secret"), "us-east-1", failed)); code == 200 || m.Stats().AuthRefused != 1 {
		t.Errorf("a wrong secret: %d, refused %d", code, m.Stats().AuthRefused)
	}
	none := aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) { return aws.Credentials{}, errors.New("no credentials") })
	if _, err := send(SigV4(http.DefaultTransport, none, "us-east-1", failed)); err == nil || failures.Load() != 1 || m.Stats().Requests != 3 {
		t.Errorf("no credentials: %v, %d failures, %d requests at the mock", err, failures.Load(), m.Stats().Requests)
	}
}
