package service

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/throttlekit/throttlekit/internal/localserver"
)

const serviceConfig = `
domain: svc
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 2}
`

// started is a service run by start.
type started struct {
	addrs  Addrs
	cancel context.CancelFunc
	done   chan error
	dir    string
}

// stop ends the service and returns what Run returned.
func (s *started) stop(tb testing.TB) error {
	tb.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		return err
	case <-time.After(30 * time.Second):
		tb.Fatal("the service did not stop")
		return nil
	}
}

// start runs the service with settings s (ConfigDir filled in with
// serviceConfig when empty, loopback addresses on free ports).
func start(tb testing.TB, s Settings) *started {
	tb.Helper()
	if s.ConfigDir == "" {
		s.ConfigDir = tb.TempDir()
		require.NoError(tb, os.WriteFile(filepath.Join(s.ConfigDir, "svc.yaml"), []byte(serviceConfig), 0o644))
	}
	d := defaults()
	for _, f := range []struct{ dst *string }{{&s.GRPCAddr}, {&s.HTTPAddr}, {&s.DebugAddr}} {
		if *f.dst == "" {
			*f.dst = "127.0.0.1:0"
		}
	}
	if s.Store == "" {
		s.Store = d.Store
	}
	if s.CallTimeout == 0 {
		// Long enough for a loaded machine: the figures tests check must be
		// the store's, never the failure mode's.
		s.CallTimeout = 10 * time.Second
	}
	if s.Shutdown == 0 {
		s.Shutdown = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Addrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, &s, slog.New(slog.NewTextHandler(io.Discard, nil)), func(a Addrs) { ready <- a })
		close(done)
	}()
	st := &started{cancel: cancel, done: done, dir: s.ConfigDir}
	select {
	case st.addrs = <-ready:
	case err := <-done:
		cancel()
		tb.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		tb.Fatal("the service did not start")
	}
	tb.Cleanup(func() { cancel(); <-done })
	return st
}

func rlsClient(tb testing.TB, addr string, opts ...grpc.DialOption) rlsv3.RateLimitServiceClient {
	tb.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, opts...)
	require.NoError(tb, err)
	tb.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func request(value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "svc", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "client", Value: value}}}}}
}

func get(tb testing.TB, url string) (int, string) {
	tb.Helper()
	resp, err := http.Get(url)
	require.NoError(tb, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	return resp.StatusCode, string(b)
}

// TestRunServesEveryEndpoint: gRPC, /json, /healthcheck, the gRPC health
// service, /metrics with envoy ratelimit's names and /rlconfig; then a
// graceful stop that fails health before it ends.
func TestRunServesEveryEndpoint(t *testing.T) {
	s := start(t, Settings{})
	c := rlsClient(t, s.addrs.GRPC)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := c.ShouldRateLimit(context.Background(), request("a"))
		require.NoError(t, err)
		assert.Equal(t, want, resp.OverallCode, "call %d", i)
	}
	resp, err := http.Post("http://"+s.addrs.HTTP+"/json", "application/json",
		strings.NewReader(`{"domain":"svc","descriptors":[{"entries":[{"key":"client","value":"a"}]}]}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)

	code, body := get(t, "http://"+s.addrs.HTTP+"/healthcheck")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "OK", body)
	conn, err := grpc.NewClient(s.addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	require.Eventually(t, func() bool {
		h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err == nil && h.Status == healthpb.HealthCheckResponse_SERVING
	}, 10*time.Second, 20*time.Millisecond)

	_, metrics := get(t, "http://"+s.addrs.Debug+"/metrics")
	assert.Contains(t, metrics, `ratelimit_service_rate_limit_total_hits{domain="svc",key1="client",key2=""} 4`)
	assert.Contains(t, metrics, `ratelimit_service_rate_limit_over_limit{domain="svc",key1="client",key2=""} 2`)
	assert.Contains(t, metrics, `ratelimit_service_config_load_success 1`)
	assert.Contains(t, metrics, `throttlekit_decisions_total`)
	_, rlconfig := get(t, "http://"+s.addrs.Debug+"/rlconfig")
	assert.Contains(t, rlconfig, "svc.client: unit=minute requests_per_unit=2")

	require.NoError(t, s.stop(t))
	_, err = net.DialTimeout("tcp", s.addrs.HTTP, time.Second)
	assert.Error(t, err, "the HTTP server is closed")
}

// TestBadConfigurationKeepsThePrevious: a file that does not load is
// refused, counted, and the rules in force keep answering.
func TestBadConfigurationKeepsThePrevious(t *testing.T) {
	s := start(t, Settings{})
	c := rlsClient(t, s.addrs.GRPC)
	resp, err := c.ShouldRateLimit(context.Background(), request("b"))
	require.NoError(t, err)
	require.Equal(t, uint32(1), resp.Statuses[0].LimitRemaining)
	require.NoError(t, os.WriteFile(filepath.Join(s.dir, "svc.yaml"), []byte("domain: svc\ndescriptors:\n  - key: client\n    rate_limit: {unit: fortnight, requests_per_unit: 2}\n"), 0o644))
	require.Eventually(t, func() bool {
		_, metrics := get(t, "http://"+s.addrs.Debug+"/metrics")
		// A write seen half done may count a second refusal.
		return regexp.MustCompile(`(?m)^ratelimit_service_config_load_error [1-9]`).MatchString(metrics)
	}, 10*time.Second, 20*time.Millisecond)
	resp, err = c.ShouldRateLimit(context.Background(), request("b"))
	require.NoError(t, err)
	assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining, "the previous rule still counts")
	// A good file is taken again.
	require.NoError(t, os.WriteFile(filepath.Join(s.dir, "svc.yaml"), []byte(strings.ReplaceAll(serviceConfig, "2}", "5}")), 0o644))
	require.Eventually(t, func() bool {
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "svc", Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "client", Value: "b"}}, HitsAddend: nil}}, HitsAddend: 0})
		return err == nil && resp.Statuses[0].CurrentLimit.RequestsPerUnit == 5
	}, 10*time.Second, 20*time.Millisecond)
}

// TestStartRefusesABadConfiguration: Run fails at once, naming the file
// and line.
func TestStartRefusesABadConfiguration(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("domain: x\ndescriptors:\n  - value: v\n"), 0o644))
	s := defaults()
	s.ConfigDir, s.GRPCAddr, s.HTTPAddr, s.DebugAddr = dir, "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	err := Run(context.Background(), &s, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad.yaml:3")
}

// TestStoreDown: with Redis stopped, answers follow the failure mode at
// once (the breaker opens), and health reports the store.
func TestStoreDown(t *testing.T) {
	localserver.SkipIfShort(t)
	redis := localserver.RedisT(t, localserver.RedisOptions{})
	for _, mode := range []string{"open", "closed", "error"} {
		t.Run(mode, func(t *testing.T) {
			s := start(t, Settings{Store: "redis://" + redis.Addr(), FailureMode: mode})
			c := rlsClient(t, s.addrs.GRPC)
			_, err := c.ShouldRateLimit(context.Background(), request(mode))
			require.NoError(t, err)
			require.NoError(t, redis.Stop())
			defer func() { require.NoError(t, redis.Start()) }()
			var last time.Duration
			for range 50 {
				began := time.Now()
				resp, err := c.ShouldRateLimit(context.Background(), request(mode))
				last = time.Since(began)
				switch mode {
				case "open":
					require.NoError(t, err)
					assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode)
				case "closed":
					require.NoError(t, err)
					assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.OverallCode)
				case "error":
					require.Error(t, err)
					assert.Contains(t, err.Error(), "store unavailable")
				}
			}
			t.Logf("%s: last answer with the store down in %v", mode, last)
			code, body := get(t, "http://"+s.addrs.HTTP+"/healthcheck")
			assert.Equal(t, http.StatusInternalServerError, code)
			assert.Contains(t, body, "store")
		})
	}
}

// certs writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all signed by the CA, and returns their paths.
func certs(t *testing.T) (caPEM, serverCert, serverKey, clientCert, clientKey string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, kind string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600))
		return p
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{name}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		require.NoError(t, err)
		keyDER, err := x509.MarshalECPrivateKey(key)
		require.NoError(t, err)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", keyDER)
	}
	serverCert, serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	clientCert, clientKey = leaf("envoy-client", 3, x509.ExtKeyUsageClientAuth)
	return write("ca.pem", "CERTIFICATE", caDER), serverCert, serverKey, clientCert, clientKey
}

// TestMutualTLS: with a client CA, only a client presenting a certificate
// it signed (and naming the SAN, when one is required) is answered.
func TestMutualTLS(t *testing.T) {
	caPEM, serverCert, serverKey, clientCert, clientKey := certs(t)
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(caPEM)
	require.NoError(t, err)
	require.True(t, pool.AppendCertsFromPEM(ca))
	pair, err := tls.LoadX509KeyPair(clientCert, clientKey)
	require.NoError(t, err)
	withCert := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}))
	withoutCert := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool}))

	// TLS alone: any client that trusts the server.
	s := start(t, Settings{TLS: TLSYAML{Cert: serverCert, Key: serverKey}})
	_, err = rlsClient(t, s.addrs.GRPC, withoutCert).ShouldRateLimit(context.Background(), request("tls"))
	require.NoError(t, err)
	_, err = rlsClient(t, s.addrs.GRPC).ShouldRateLimit(context.Background(), request("plain"))
	require.Error(t, err, "a plaintext client is refused")

	// Mutual TLS, with a SAN required.
	for san, wantOK := range map[string]bool{"envoy-client": true, "someone-else": false} {
		s := start(t, Settings{TLS: TLSYAML{Cert: serverCert, Key: serverKey, ClientCA: caPEM, ClientSAN: san}})
		_, err = rlsClient(t, s.addrs.GRPC, withCert).ShouldRateLimit(context.Background(), request("mtls"))
		if wantOK {
			require.NoError(t, err)
		} else {
			require.Error(t, err)
		}
		_, err = rlsClient(t, s.addrs.GRPC, withoutCert).ShouldRateLimit(context.Background(), request("mtls"))
		require.Error(t, err, "a client without a certificate is refused")
	}
}

// TestSettings reads envoy ratelimit's environment, a settings file and
// flags, in that order, and refuses what it cannot use.
func TestSettings(t *testing.T) {
	env := map[string]string{
		"RUNTIME_ROOT": "/srv/rt", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_APPDIRECTORY": "config",
		"GRPC_PORT": "9081", "PORT": "9080", "REDIS_URL": "10.1.2.3:6379", "REDIS_TYPE": "cluster", "REDIS_AUTH": "pw",
		"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_RESET_HEADER": "X-RateLimit-Reset", "NEAR_LIMIT_RATIO": "0.9",
	}
	getenv := func(k string) string { return env[k] }
	s, err := ParseFlags(flag.NewFlagSet("t", flag.ContinueOnError), nil, getenv)
	require.NoError(t, err)
	assert.Equal(t, "/srv/rt/ratelimit/config", s.ConfigDir)
	assert.Equal(t, ":9081", s.GRPCAddr)
	assert.Equal(t, ":9080", s.HTTPAddr)
	assert.Equal(t, "redis+cluster://:pw@10.1.2.3:6379", s.Store)
	// In envoy ratelimit's place, its counters are the way in.
	assert.Equal(t, &RolloutYAML{Old: "envoy+redis+cluster://:pw@10.1.2.3:6379", New: s.Store, Mode: "split", Percent: 100}, s.Rollout)
	s2, err := ParseFlags(flag.NewFlagSet("t", flag.ContinueOnError), []string{"-store", "memory"}, getenv)
	require.NoError(t, err)
	assert.Nil(t, s2.Rollout, "-store chooses the store")
	require.NotNil(t, s.Headers)
	assert.Equal(t, "X-RateLimit-Reset", s.Headers.Reset)
	assert.Equal(t, 0.9, s.NearLimit)

	file := filepath.Join(t.TempDir(), "s.yaml")
	require.NoError(t, os.WriteFile(file, []byte("store: memcached://127.0.0.1:11211\nfailure_mode: closed\nrollout:\n  old: memory\n  new: memory\n  percent: 30\n"), 0o644))
	s, err = ParseFlags(flag.NewFlagSet("t", flag.ContinueOnError), []string{"-settings", file, "-failure-mode", "error"}, getenv)
	require.NoError(t, err)
	assert.Equal(t, "memcached://127.0.0.1:11211", s.Store)
	assert.Equal(t, "error", s.FailureMode, "a flag overrides the file")
	assert.Equal(t, 30, s.Rollout.Percent)

	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
	}{
		"no config dir":      {nil, nil},
		"unknown field":      {[]string{"-config", "x", "-settings", writeTemp(t, "colour: blue\n")}, nil},
		"bad redis type":     {[]string{"-config", "x"}, map[string]string{"REDIS_URL": "h:1", "REDIS_TYPE": "mesh"}},
		"bad bool":           {[]string{"-config", "x"}, map[string]string{"SHADOW_MODE": "maybe"}},
		"cert without key":   {[]string{"-config", "x", "-settings", writeTemp(t, "tls: {cert: a.pem}\n")}, nil},
		"stray argument":     {[]string{"-config", "x", "extra"}, nil},
		"bad log level":      {[]string{"-config", "x", "-log-level", "loud"}, nil},
		"client CA, no cert": {[]string{"-config", "x", "-settings", writeTemp(t, "tls: {client_ca: ca.pem}\n")}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			_, err := ParseFlags(fs, tc.args, func(k string) string { return tc.env[k] })
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalidSettings), "%v", err)
		})
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "settings.yaml")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

// TestStartedInEnvoyRatelimitsPlace: started with envoy ratelimit's
// environment on the Redis envoy ratelimit used, the service carries every
// open window from envoy ratelimit's keys: a client's count goes on where
// envoy ratelimit left it, with the same reset.
func TestStartedInEnvoyRatelimitsPlace(t *testing.T) {
	localserver.SkipIfShort(t)
	r := localserver.RedisT(t, localserver.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(strings.ReplaceAll(serviceConfig, "unit: minute, requests_per_unit: 2", "unit: hour, requests_per_unit: 10")), 0o644))
	// What envoy ratelimit left: 4 hits of client=envoyed in this hour's
	// window, under its CACHE_KEY_PREFIX.
	hour := time.Now().Unix() / 3600 * 3600
	if time.Now().Unix()-hour > 3590 {
		time.Sleep(11 * time.Second) // not across the hour's end
		hour = time.Now().Unix() / 3600 * 3600
	}
	key := fmt.Sprintf("pfx:svc_client_envoyed_%d", hour)
	require.NoError(t, c.IncrBy(context.Background(), key, 4).Err())
	env := map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "REDIS_URL": r.Addr(),
		"CACHE_KEY_PREFIX": "pfx:", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0",
		"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0"}
	settings, err := ParseFlags(flag.NewFlagSet("t", flag.ContinueOnError), nil, func(k string) string { return env[k] })
	require.NoError(t, err)
	s := start(t, *settings)
	resp, err := rlsClient(t, s.addrs.GRPC).ShouldRateLimit(context.Background(), request("envoyed"))
	require.NoError(t, err)
	st := resp.Statuses[0]
	assert.Equal(t, uint32(10-4-1), st.LimitRemaining, "the count goes on from envoy ratelimit's")
	end := time.Unix(hour+3600, 0)
	assert.WithinDuration(t, end, time.Now().Add(st.DurationUntilReset.AsDuration()), time.Second)
}
