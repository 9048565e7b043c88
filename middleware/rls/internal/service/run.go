package service

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/throttlekit/throttlekit/middleware/rls"
	"github.com/throttlekit/throttlekit/middleware/rls/config"
	"github.com/throttlekit/throttlekit/middleware/rls/store"
	promobserver "github.com/throttlekit/throttlekit/observe/prometheus"
	"github.com/throttlekit/throttlekit/throttler"
)

// Addrs are the addresses the servers listen on, known once they do.
type Addrs struct {
	GRPC, HTTP, Debug string
}

// Run starts the service and serves until ctx is done, then drains: health
// fails at once, in-flight requests finish within the shutdown grace, and the
// store's clients close. ready, when not nil, is called with the bound
// addresses once every server listens.
func Run(ctx context.Context, s *Settings, log *slog.Logger, ready func(Addrs)) error {
	var st *store.Store
	var err error
	if rs := s.rolloutSettings(); rs != nil {
		st, err = store.Rollout(*rs, s.CallTimeout)
	} else {
		st, err = store.Open(s.Store, s.CallTimeout)
	}
	if err != nil {
		return err
	}
	defer st.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	collector, err := promobserver.New()
	if err != nil {
		return err
	}
	if err := reg.Register(collector); err != nil {
		return err
	}
	metrics, err := rls.NewMetrics(reg)
	if err != nil {
		return err
	}
	th, err := throttler.New(st.Backend, throttler.WithObserver(collector), throttler.WithLogger(log),
		throttler.WithCallTimeout(s.CallTimeout))
	if err != nil {
		return err
	}
	opts, err := s.Options(log)
	if err != nil {
		return err
	}
	opts = append(opts, rls.WithMetrics(metrics))
	srv, err := rls.New(th, nil, opts...)
	if err != nil {
		return err
	}
	cfgOpts := []config.Option{config.MergeDomains(s.MergeDomain)}
	cfg, err := config.LoadDir(s.ConfigDir, cfgOpts...)
	if err != nil {
		metrics.ConfigLoadFailed()
		return fmt.Errorf("loading %s: %w", s.ConfigDir, err)
	}
	if err := srv.SetConfig(cfg); err != nil {
		return err
	}
	log.Info("throttlekit-rls: configuration loaded", "dir", s.ConfigDir, "domains", len(cfg.Domains()), "rules", len(cfg.Rules()), "store", st.Kind)

	hc := srv.NewHealth(time.Second)
	grpcHealth := health.NewServer()

	maxRecv := rls.DefaultBounds.RequestBytes
	if s.Bounds.RequestBytes > 0 {
		maxRecv = s.Bounds.RequestBytes
	}
	grpcOpts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRecv),
		// Requests run on long-lived workers, whose stacks have grown
		// once, rather than on a new goroutine each: a new goroutine's
		// stack grows on every request's first deep call (11.7% of the
		// service's CPU in bench/RLS.md's profile). A request finding every
		// worker busy gets a goroutine of its own, as without workers.
		grpc.NumStreamWorkers(uint32(16 * runtime.GOMAXPROCS(0))),
	}
	var httpTLS *tls.Config
	if s.TLS.Cert != "" {
		tc, err := serverTLS(s.TLS)
		if err != nil {
			return err
		}
		grpcOpts = append(grpcOpts, grpc.Creds(credentials.NewTLS(tc)))
		if s.TLS.HTTPTLS {
			httpTLS = tc
		}
	}
	gs := grpc.NewServer(grpcOpts...)
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	healthpb.RegisterHealthServer(gs, grpcHealth)

	mux := http.NewServeMux()
	mux.Handle("/json", srv.JSONHandler())
	mux.Handle("/healthcheck", hc)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, TLSConfig: httpTLS}

	debug := http.NewServeMux()
	debug.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	debug.HandleFunc("/rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		c := srv.Config()
		for _, r := range c.Rules() {
			fmt.Fprintf(w, "%s: unit=%s requests_per_unit=%d unlimited=%t shadow_mode=%t limits=%v (%s:%d)\n",
				r.FullKey, r.Unit, r.RequestsPerUnit, r.Unlimited, r.ShadowMode, r.Limits, r.File, r.Line)
		}
	})
	debug.HandleFunc("/debug/pprof/", pprof.Index)
	debug.HandleFunc("/debug/pprof/profile", pprof.Profile)
	debug.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	debug.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ds := &http.Server{Handler: debug, ReadHeaderTimeout: 5 * time.Second}

	gl, err := net.Listen("tcp", s.GRPCAddr)
	if err != nil {
		return fmt.Errorf("grpc listen: %w", err)
	}
	hl, err := net.Listen("tcp", s.HTTPAddr)
	if err != nil {
		gl.Close()
		return fmt.Errorf("http listen: %w", err)
	}
	var dl net.Listener
	if s.DebugAddr != "off" {
		if dl, err = net.Listen("tcp", s.DebugAddr); err != nil {
			gl.Close()
			hl.Close()
			return fmt.Errorf("debug listen: %w", err)
		}
	}

	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Watch(watchCtx, s.ConfigDir, 0, cfgOpts, nil); err != nil {
			log.Error("throttlekit-rls: not watching the configuration", "err", err)
		}
	}()
	// The gRPC health service follows the HTTP one.
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			st := healthpb.HealthCheckResponse_SERVING
			if hc.Check(watchCtx) != nil {
				st = healthpb.HealthCheckResponse_NOT_SERVING
			}
			grpcHealth.SetServingStatus("", st)
			grpcHealth.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
			select {
			case <-watchCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	go func() { errs <- gs.Serve(gl) }()
	go func() {
		if httpTLS != nil {
			errs <- hs.ServeTLS(hl, "", "")
		} else {
			errs <- hs.Serve(hl)
		}
	}()
	if dl != nil {
		go func() { errs <- ds.Serve(dl) }()
	}
	addrs := Addrs{GRPC: gl.Addr().String(), HTTP: hl.Addr().String()}
	if dl != nil {
		addrs.Debug = dl.Addr().String()
	}
	log.Info("throttlekit-rls: serving", "grpc", addrs.GRPC, "http", addrs.HTTP, "debug", addrs.Debug)
	if ready != nil {
		ready(addrs)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-errs:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			runErr = err
		}
	}
	// Drain: fail health first, so balancers stop sending, then let the
	// requests in flight finish.
	hc.Drain()
	grpcHealth.Shutdown()
	log.Info("throttlekit-rls: draining", "grace", s.Shutdown)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.Shutdown)
	defer cancel()
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	_ = hs.Shutdown(shutdownCtx)
	_ = ds.Shutdown(shutdownCtx)
	select {
	case <-done:
	case <-shutdownCtx.Done():
		gs.Stop()
	}
	stopWatch()
	wg.Wait()
	return runErr
}

// serverTLS builds the servers' TLS: a certificate, and with a client CA,
// mutual TLS requiring a client certificate that CA signed (and, with a
// SAN, naming it).
func serverTLS(t TLSYAML) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: TLS: %w", ErrInvalidSettings, err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.MinVersion == "1.3" {
		tc.MinVersion = tls.VersionTLS13
	}
	if t.ClientCA != "" {
		pem, err := os.ReadFile(t.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS client CA: %w", ErrInvalidSettings, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: TLS client CA %s holds no certificate", ErrInvalidSettings, t.ClientCA)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
		if t.ClientSAN != "" {
			san := t.ClientSAN
			tc.VerifyPeerCertificate = func(_ [][]byte, chains [][]*x509.Certificate) error {
				for _, chain := range chains {
					if len(chain) == 0 {
						continue
					}
					leaf := chain[0]
					if leaf.VerifyHostname(san) == nil {
						return nil
					}
					for _, u := range leaf.URIs {
						if u.String() == san {
							return nil
						}
					}
				}
				return fmt.Errorf("throttlekit-rls: client certificate does not name %q", san)
			}
		}
	}
	return tc, nil
}
