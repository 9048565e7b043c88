package service

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/throttlekit/throttlekit/middleware/rls"
	"github.com/throttlekit/throttlekit/middleware/rls/store"
)

// ErrInvalidSettings is wrapped by every error about the service's settings.
var ErrInvalidSettings = errors.New("throttlekit-rls: invalid settings")

// Settings are everything the service is started with.
type Settings struct {
	ConfigDir   string        `yaml:"config"`
	GRPCAddr    string        `yaml:"grpc"`
	HTTPAddr    string        `yaml:"http"`
	DebugAddr   string        `yaml:"debug"`
	Store       string        `yaml:"store"`
	Rollout     *RolloutYAML  `yaml:"rollout"`
	FailureMode string        `yaml:"failure_mode"`
	EnvoyCompat bool          `yaml:"envoy_compat"`
	ShadowMode  bool          `yaml:"shadow_mode"`
	Headers     *HeadersYAML  `yaml:"response_headers"`
	NearLimit   float64       `yaml:"near_limit_ratio"`
	MergeDomain bool          `yaml:"merge_domain_config"`
	CallTimeout time.Duration `yaml:"call_timeout"`
	Shutdown    time.Duration `yaml:"shutdown_grace"`
	TLS         TLSYAML       `yaml:"tls"`
	Bounds      BoundsYAML    `yaml:"bounds"`
	LogLevel    slog.Level    `yaml:"-"`
	LogLevelStr string        `yaml:"log_level"`

	// envWayIn is the rollout envoy ratelimit's environment implied,
	// dropped when the file or a flag names the store.
	envWayIn *RolloutYAML
}

// RolloutYAML is the rollout block of the settings file.
type RolloutYAML struct {
	Old     string       `yaml:"old"`
	New     string       `yaml:"new"`
	Mode    string       `yaml:"mode"`
	Percent int          `yaml:"percent"`
	Unleash *UnleashYAML `yaml:"unleash"`
}

// UnleashYAML names the Unleash toggle of a rollout.
type UnleashYAML struct {
	URL     string        `yaml:"url"`
	App     string        `yaml:"app"`
	Token   string        `yaml:"token"`
	Toggle  string        `yaml:"toggle"`
	Wait    time.Duration `yaml:"wait_for_first_fetch"`
	Refresh time.Duration `yaml:"refresh_interval"`
}

// HeadersYAML names the response headers; present means enabled.
type HeadersYAML struct {
	Limit     string `yaml:"limit"`
	Remaining string `yaml:"remaining"`
	Reset     string `yaml:"reset"`
}

// TLSYAML is the gRPC server's TLS: a certificate and key, and with
// ClientCA, mutual TLS (clients must present a certificate it signed).
type TLSYAML struct {
	Cert       string `yaml:"cert"`
	Key        string `yaml:"key"`
	ClientCA   string `yaml:"client_ca"`
	ClientSAN  string `yaml:"client_san"`
	HTTPTLS    bool   `yaml:"http"`
	MinVersion string `yaml:"min_version"`
}

// BoundsYAML are the request bounds (rls.Bounds).
type BoundsYAML struct {
	Descriptors  int `yaml:"descriptors"`
	Entries      int `yaml:"entries"`
	ValueBytes   int `yaml:"value_bytes"`
	RequestBytes int `yaml:"request_bytes"`
}

// Options turns the settings into the server's options.
func (s *Settings) Options(log *slog.Logger) ([]rls.Option, error) {
	opts := []rls.Option{rls.WithLogger(log), rls.WithBounds(rls.Bounds(s.Bounds))}
	if s.FailureMode != "" {
		m, err := rls.ParseFailureMode(s.FailureMode)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidSettings, err)
		}
		opts = append(opts, rls.WithFailureMode(m))
	}
	if s.EnvoyCompat {
		opts = append(opts, rls.WithEnvoyCompat())
	}
	if s.ShadowMode {
		opts = append(opts, rls.WithGlobalShadowMode())
	}
	if s.Headers != nil {
		opts = append(opts, rls.WithResponseHeaders(rls.HeaderNames(*s.Headers)))
	}
	if s.NearLimit != 0 {
		opts = append(opts, rls.WithNearLimitRatio(s.NearLimit))
	}
	return opts, nil
}

// storeSettings returns the rollout settings, or nil for one store.
func (s *Settings) rolloutSettings() *store.RolloutSettings {
	if s.Rollout == nil {
		return nil
	}
	rs := &store.RolloutSettings{Old: s.Rollout.Old, New: s.Rollout.New, Mode: s.Rollout.Mode, Percent: s.Rollout.Percent}
	if u := s.Rollout.Unleash; u != nil {
		rs.Unleash = &store.UnleashSettings{URL: u.URL, App: u.App, Token: u.Token, Toggle: u.Toggle, WaitForFirstFetch: u.Wait, RefreshInterval: u.Refresh}
	}
	return rs
}

// defaults are the settings before the environment, the file and the flags.
func defaults() Settings {
	return Settings{
		GRPCAddr:    ":8081",
		HTTPAddr:    ":8080",
		DebugAddr:   ":6070",
		Store:       "memory",
		CallTimeout: 100 * time.Millisecond,
		Shutdown:    10 * time.Second,
		LogLevelStr: "info",
	}
}

// fromEnv applies envoy ratelimit's environment variables that have a
// meaning here.
func fromEnv(s *Settings, getenv func(string) string) error {
	hostPort := func(host, port, def string) string {
		h, p := getenv(host), getenv(port)
		if h == "" && p == "" {
			return def
		}
		dh, dp, _ := strings.Cut(def, ":")
		if h == "" {
			h = dh
		}
		if p == "" {
			p = dp
		}
		return h + ":" + p
	}
	s.GRPCAddr = hostPort("GRPC_HOST", "GRPC_PORT", s.GRPCAddr)
	s.HTTPAddr = hostPort("HOST", "PORT", s.HTTPAddr)
	s.DebugAddr = hostPort("DEBUG_HOST", "DEBUG_PORT", s.DebugAddr)
	if root := getenv("RUNTIME_ROOT"); root != "" || getenv("RUNTIME_APPDIRECTORY") != "" {
		if root == "" {
			root = "/srv/runtime_data/current"
		}
		app := getenv("RUNTIME_APPDIRECTORY")
		if app == "" {
			app = "config"
		}
		s.ConfigDir = filepath.Join(root, getenv("RUNTIME_SUBDIRECTORY"), app)
	}
	if u := getenv("REDIS_URL"); u != "" {
		auth := getenv("REDIS_AUTH")
		cred := ""
		if auth != "" {
			user, pass, ok := strings.Cut(auth, ":")
			if !ok {
				user, pass = "", auth
			}
			cred = user + ":" + pass + "@"
		}
		switch strings.ToLower(getenv("REDIS_TYPE")) {
		case "", "single":
			s.Store = "redis://" + cred + u
		case "cluster":
			s.Store = "redis+cluster://" + cred + u
		case "sentinel":
			// envoy ratelimit writes "master,host:port,host:port".
			master, addrs, _ := strings.Cut(u, ",")
			s.Store = "redis+sentinel://" + cred + addrs + "/" + master
		default:
			return fmt.Errorf("%w: REDIS_TYPE=%q: want single, cluster or sentinel", ErrInvalidSettings, getenv("REDIS_TYPE"))
		}
		// Started in envoy ratelimit's place, with its environment: the
		// way in, so that no open window restarts. Each descriptor's first
		// decision reads envoy ratelimit's counter on the same Redis and
		// carries it into throttlekit's keys there (a split rollout at
		// 100 % from envoy ratelimit's keys, read-only). -store, or a
		// settings file naming a store or a rollout, replaces it.
		old := "envoy+" + s.Store
		if p := getenv("CACHE_KEY_PREFIX"); p != "" {
			old += "?prefix=" + url.QueryEscape(p)
		}
		s.Rollout = &RolloutYAML{Old: old, New: s.Store, Mode: "split", Percent: 100}
		s.envWayIn = s.Rollout
	}
	boolEnv := func(name string, dst *bool) error {
		if v := getenv(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%w: %s=%q: want true or false", ErrInvalidSettings, name, v)
			}
			*dst = b
		}
		return nil
	}
	var headers bool
	for name, dst := range map[string]*bool{
		"LIMIT_RESPONSE_HEADERS_ENABLED": &headers,
		"SHADOW_MODE":                    &s.ShadowMode,
		"MERGE_DOMAIN_CONFIG":            &s.MergeDomain,
	} {
		if err := boolEnv(name, dst); err != nil {
			return err
		}
	}
	if headers {
		s.Headers = &HeadersYAML{Limit: getenv("LIMIT_LIMIT_HEADER"), Remaining: getenv("LIMIT_REMAINING_HEADER"), Reset: getenv("LIMIT_RESET_HEADER")}
	}
	if v := getenv("NEAR_LIMIT_RATIO"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("%w: NEAR_LIMIT_RATIO=%q", ErrInvalidSettings, v)
		}
		s.NearLimit = r
	}
	var useTLS bool
	if err := boolEnv("GRPC_SERVER_USE_TLS", &useTLS); err != nil {
		return err
	}
	if useTLS {
		s.TLS.Cert = getenv("GRPC_SERVER_TLS_CERT")
		s.TLS.Key = getenv("GRPC_SERVER_TLS_KEY")
		s.TLS.ClientCA = getenv("GRPC_CLIENT_TLS_CACERT")
		s.TLS.ClientSAN = getenv("GRPC_CLIENT_TLS_SAN")
	}
	return nil
}

// ParseFlags reads the settings: defaults, then envoy ratelimit's
// environment variables, then the -settings file, then the other flags.
func ParseFlags(fs *flag.FlagSet, args []string, getenv func(string) string) (*Settings, error) {
	s := defaults()
	if err := fromEnv(&s, getenv); err != nil {
		return nil, err
	}
	settingsFile := fs.String("settings", "", "a YAML file of settings (flags override it)")
	configDir := fs.String("config", "", "the directory of envoy ratelimit configuration files (*.yaml), watched for changes")
	grpcAddr := fs.String("grpc", "", "the gRPC address (default "+s.GRPCAddr+")")
	httpAddr := fs.String("http", "", "the HTTP address of /json and /healthcheck (default "+s.HTTPAddr+")")
	debugAddr := fs.String("debug", "", "the address of /metrics, /rlconfig and /debug/pprof/ (default "+s.DebugAddr+"; \"off\" disables it)")
	storeSpec := fs.String("store", "", "the store: memory, redis://, redis+cluster://, redis+sentinel://, groups:, memcached:// or envoy+redis:// (default "+s.Store+")")
	failure := fs.String("failure-mode", "", "what a decision becomes when the store fails: open, closed or error")
	compat := fs.Bool("envoy-compat", false, "count as envoy ratelimit does: descriptors decided apart, denied hits counted, unknown domains OK")
	headers := fs.Bool("response-headers", false, "ask Envoy to add RateLimit-Limit, -Remaining and -Reset")
	logLevel := fs.String("log-level", "", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected argument %q", ErrInvalidSettings, fs.Arg(0))
	}
	if *settingsFile != "" {
		// The way in envoy ratelimit's environment implies stays unless
		// the file names a store or a rollout.
		envRollout, envStore := s.Rollout, s.Store
		s.Rollout = nil
		if err := readFile(&s, *settingsFile); err != nil {
			return nil, err
		}
		if s.Rollout == nil && s.Store == envStore {
			s.Rollout = envRollout
		}
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	if *storeSpec != "" && s.Rollout != nil && s.Rollout == s.envWayIn {
		s.Rollout = nil // -store chose the store
	}
	set(&s.ConfigDir, *configDir)
	set(&s.GRPCAddr, *grpcAddr)
	set(&s.HTTPAddr, *httpAddr)
	set(&s.DebugAddr, *debugAddr)
	set(&s.Store, *storeSpec)
	set(&s.FailureMode, *failure)
	set(&s.LogLevelStr, *logLevel)
	if *compat {
		s.EnvoyCompat = true
	}
	if *headers && s.Headers == nil {
		s.Headers = &HeadersYAML{}
	}
	if err := s.LogLevel.UnmarshalText([]byte(s.LogLevelStr)); err != nil {
		return nil, fmt.Errorf("%w: log level %q", ErrInvalidSettings, s.LogLevelStr)
	}
	if s.ConfigDir == "" {
		return nil, fmt.Errorf("%w: no configuration directory: give -config DIR (or RUNTIME_ROOT)", ErrInvalidSettings)
	}
	if (s.TLS.Cert == "") != (s.TLS.Key == "") {
		return nil, fmt.Errorf("%w: TLS needs both a certificate and a key", ErrInvalidSettings)
	}
	if s.TLS.ClientCA != "" && s.TLS.Cert == "" {
		return nil, fmt.Errorf("%w: a client CA (mutual TLS) needs the server's certificate and key", ErrInvalidSettings)
	}
	return &s, nil
}

// readFile applies a YAML settings file; unknown fields are errors.
func readFile(s *Settings, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSettings, err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(s); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalidSettings, path, err)
	}
	return nil
}
