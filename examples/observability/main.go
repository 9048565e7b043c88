// Command observability wires a throttler to what an operator reads: a
// Prometheus collector on /metrics, the debug page on /debug/throttlekit,
// and denials logged with the request's context, all on an internal
// loopback port. It makes a few decisions, then reads both pages the way
// Prometheus and a person would.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	debugpage "github.com/throttlekit/throttlekit/observe/debug"
	promobserver "github.com/throttlekit/throttlekit/observe/prometheus"
	slogobserver "github.com/throttlekit/throttlekit/observe/slog"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	backend := memorybackend.New()
	policy, err := throttler.ParsePolicy("api", "3/min, 100/h")
	if err != nil {
		log.Fatal(err)
	}
	collector, err := promobserver.New()
	if err != nil {
		log.Fatal(err)
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(collector)
	page, err := debugpage.New(debugpage.WithBackend("memory", backend), debugpage.WithPolicies(policy))
	if err != nil {
		log.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "reset_at" || a.Key == "retry_after" || a.Key == "latency" {
				return slog.Attr{} // left out so that the output is the same every run
			}
			return a
		},
	}))
	th, err := throttler.New(backend,
		throttler.WithObserver(collector),
		throttler.WithObserver(page.Observer()),
		throttler.WithObserver(slogobserver.New(logger)))
	if err != nil {
		log.Fatal(err)
	}

	// The internal port: never the one the API serves.
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.Handle("/debug/throttlekit", page)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = http.Serve(lis, mux) }()

	for _, id := range []string{"alice", "alice", "alice", "alice", "bob"} {
		if _, err := th.Allow(context.Background(), policy, id); err != nil {
			log.Fatal(err)
		}
	}

	base := "http://" + lis.Addr().String()
	for _, line := range strings.Split(fetch(base+"/metrics"), "\n") {
		if strings.HasPrefix(line, "throttlekit_decisions_total") || strings.HasPrefix(line, "throttlekit_near_limit_total") {
			fmt.Println(line)
		}
	}
	debug := fetch(base + "/debug/throttlekit?format=json")
	fmt.Println("debug page names alice:", strings.Contains(debug, `"identifier": "alice"`))
}

func fetch(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	return string(body)
}
