package service

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/throttlekit/throttlekit/internal/localserver"
)

// This file checks that a client in another language, Node.js with
// @grpc/grpc-js and its own copy of Envoy's protos
// (testdata/node-client), gets from the service the same answers as
// go-control-plane's Go client, step by step.

// nodeClientDir holds the Node.js client; its package-lock.json pins every
// package it installs.
const nodeClientDir = "testdata/node-client"

// nodeConfig is the envoy ratelimit configuration both clients are
// answered under.
const nodeConfig = `
domain: nodeclient
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: bulk
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: internal
    rate_limit: {unlimited: true}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// The wire types of the Node.js client's stdin and stdout (client.js).
type (
	nodeEntry struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	nodeOverride struct {
		RequestsPerUnit uint32 `json:"requestsPerUnit"`
		Unit            string `json:"unit"` // envoy.type.v3.RateLimitUnit
	}
	nodeDescriptor struct {
		Entries    []nodeEntry   `json:"entries"`
		HitsAddend *uint64       `json:"hitsAddend,omitempty"`
		Limit      *nodeOverride `json:"limit,omitempty"`
	}
	nodeRequest struct {
		Domain      string           `json:"domain"`
		HitsAddend  uint32           `json:"hitsAddend,omitempty"`
		Descriptors []nodeDescriptor `json:"descriptors"`
	}

	nodeLimit struct {
		Name            string `json:"name"`
		RequestsPerUnit uint32 `json:"requestsPerUnit"`
		Unit            string `json:"unit"`
	}
	nodeStatus struct {
		Code      string     `json:"code"`
		Limit     *nodeLimit `json:"limit"`
		Remaining uint32     `json:"remaining"`
		ResetMs   *int64     `json:"resetMs"`
	}
	nodeHeader struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	nodeAnswer struct {
		GRPCCode    codes.Code   `json:"grpcCode"`
		Message     string       `json:"message,omitempty"`
		OverallCode string       `json:"overallCode,omitempty"`
		Statuses    []nodeStatus `json:"statuses,omitempty"`
		Headers     []nodeHeader `json:"headers,omitempty"`
	}
)

// toProto is the request the Go client sends for r.
func (r nodeRequest) toProto() *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: r.Domain, HitsAddend: r.HitsAddend}
	for _, d := range r.Descriptors {
		pd := &commonv3.RateLimitDescriptor{}
		for _, e := range d.Entries {
			pd.Entries = append(pd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if d.HitsAddend != nil {
			pd.HitsAddend = wrapperspb.UInt64(*d.HitsAddend)
		}
		if d.Limit != nil {
			pd.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{
				RequestsPerUnit: d.Limit.RequestsPerUnit,
				Unit:            typev3.RateLimitUnit(typev3.RateLimitUnit_value[d.Limit.Unit]),
			}
		}
		req.Descriptors = append(req.Descriptors, pd)
	}
	return req
}

// nodeGoAnswer is the answer line the Go client's result stands for.
func nodeGoAnswer(resp *rlsv3.RateLimitResponse, err error) nodeAnswer {
	if err != nil {
		st := status.Convert(err)
		return nodeAnswer{GRPCCode: st.Code(), Message: st.Message()}
	}
	a := nodeAnswer{OverallCode: resp.GetOverallCode().String()}
	for _, s := range resp.GetStatuses() {
		ns := nodeStatus{Code: s.GetCode().String(), Remaining: s.GetLimitRemaining()}
		if l := s.GetCurrentLimit(); l != nil {
			ns.Limit = &nodeLimit{Name: l.GetName(), RequestsPerUnit: l.GetRequestsPerUnit(), Unit: l.GetUnit().String()}
		}
		if d := s.GetDurationUntilReset(); d != nil {
			ms := d.AsDuration().Milliseconds()
			ns.ResetMs = &ms
		}
		a.Statuses = append(a.Statuses, ns)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		a.Headers = append(a.Headers, nodeHeader{Key: h.GetKey(), Value: h.GetValue()})
	}
	return a
}

// The response headers the service is started with (envoy ratelimit's
// default names).
const (
	nodeHdrLimit     = "RateLimit-Limit"
	nodeHdrRemaining = "RateLimit-Remaining"
	nodeHdrReset     = "RateLimit-Reset"
)

// nodeWantStatus is what one descriptor's status must say; limit 0 means no
// current_limit.
type nodeWantStatus struct {
	code      string
	limit     uint32
	unit      string
	remaining uint32
}

// nodeStep is one request of the sequence, as a function of the client's
// own descriptor value, and what it must be answered.
type nodeStep struct {
	name     string
	req      func(v string) nodeRequest
	grpcCode codes.Code // when not OK, the call must fail with it
	overall  string
	statuses []nodeWantStatus
	// headers are the limit and remaining headers; nil means none.
	headers *[2]uint32
}

func nodeEntries(kv ...string) []nodeEntry {
	var es []nodeEntry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, nodeEntry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// nodeOne is a request of one descriptor of key, value pairs; "$" in a value
// stands for the client's own value.
func nodeOne(kv ...string) func(v string) nodeRequest {
	return func(v string) nodeRequest {
		kv := append([]string(nil), kv...)
		for i := 1; i < len(kv); i += 2 {
			kv[i] = strings.ReplaceAll(kv[i], "$", v)
		}
		return nodeRequest{Domain: "nodeclient", Descriptors: []nodeDescriptor{{Entries: nodeEntries(kv...)}}}
	}
}

func nodeU64(n uint64) *uint64 { return &n }

func nodeHdr(limit, remaining uint32) *[2]uint32 { return &[2]uint32{limit, remaining} }

// nodeSteps is the sequence both clients send, each on its own values.
func nodeSteps() []nodeStep {
	const ok, over = "OK", "OVER_LIMIT"
	return []nodeStep{
		{name: "client 1/3", req: nodeOne("client", "$"), overall: ok,
			statuses: []nodeWantStatus{{ok, 3, "MINUTE", 2}}, headers: nodeHdr(3, 2)},
		{name: "client 2/3", req: nodeOne("client", "$"), overall: ok,
			statuses: []nodeWantStatus{{ok, 3, "MINUTE", 1}}, headers: nodeHdr(3, 1)},
		{name: "client 3/3", req: nodeOne("client", "$"), overall: ok,
			statuses: []nodeWantStatus{{ok, 3, "MINUTE", 0}}, headers: nodeHdr(3, 0)},
		{name: "client over", req: nodeOne("client", "$"), overall: over,
			statuses: []nodeWantStatus{{over, 3, "MINUTE", 0}}, headers: nodeHdr(3, 0)},
		{name: "nested 1/2", req: nodeOne("tenant", "acme", "user", "$"), overall: ok,
			statuses: []nodeWantStatus{{ok, 2, "MINUTE", 1}}, headers: nodeHdr(2, 1)},
		{name: "nested with hits_addend 1 and unlimited", req: func(v string) nodeRequest {
			return nodeRequest{Domain: "nodeclient", Descriptors: []nodeDescriptor{
				{Entries: nodeEntries("tenant", "acme", "user", v), HitsAddend: nodeU64(1)},
				{Entries: nodeEntries("internal", v)},
			}}
		}, overall: ok,
			statuses: []nodeWantStatus{{ok, 2, "MINUTE", 0}, {ok, 0, "", math.MaxUint32}}, headers: nodeHdr(2, 0)},
		{name: "nested over", req: nodeOne("tenant", "acme", "user", "$"), overall: over,
			statuses: []nodeWantStatus{{over, 2, "MINUTE", 0}}, headers: nodeHdr(2, 0)},
		{name: "nested other user checked with hits_addend 0", req: func(v string) nodeRequest {
			return nodeRequest{Domain: "nodeclient", Descriptors: []nodeDescriptor{
				{Entries: nodeEntries("tenant", "acme", "user", v+"-other"), HitsAddend: nodeU64(0)},
			}}
		}, overall: ok,
			statuses: []nodeWantStatus{{ok, 2, "MINUTE", 2}}, headers: nodeHdr(2, 2)},
		{name: "no rule", req: nodeOne("nothing", "$"), overall: ok,
			statuses: []nodeWantStatus{{ok, 0, "", 0}}},
		{name: "bulk 4 of 10", req: func(v string) nodeRequest {
			return nodeRequest{Domain: "nodeclient", Descriptors: []nodeDescriptor{
				{Entries: nodeEntries("bulk", v), HitsAddend: nodeU64(4)}}}
		}, overall: ok,
			statuses: []nodeWantStatus{{ok, 10, "HOUR", 6}}, headers: nodeHdr(10, 6)},
		{name: "bulk 7 more is over", req: func(v string) nodeRequest {
			return nodeRequest{Domain: "nodeclient", HitsAddend: 7, Descriptors: []nodeDescriptor{
				{Entries: nodeEntries("bulk", v)}}}
		}, overall: over,
			statuses: []nodeWantStatus{{over, 10, "HOUR", 6}}, headers: nodeHdr(10, 6)},
		{name: "bulk the 6 left", req: func(v string) nodeRequest {
			return nodeRequest{Domain: "nodeclient", Descriptors: []nodeDescriptor{
				{Entries: nodeEntries("bulk", v), HitsAddend: nodeU64(6)}}}
		}, overall: ok,
			statuses: []nodeWantStatus{{ok, 10, "HOUR", 0}}, headers: nodeHdr(10, 0)},
		{name: "shadow 1/1", req: nodeOne("trial", "$"), overall: ok,
			statuses: []nodeWantStatus{{ok, 1, "MINUTE", 0}}, headers: nodeHdr(1, 0)},
		{name: "shadow over answers OK", req: nodeOne("trial", "$"), overall: ok,
			statuses: []nodeWantStatus{{ok, 1, "MINUTE", 0}}, headers: nodeHdr(1, 0)},
		{name: "over and shadow together", req: func(v string) nodeRequest {
			return nodeRequest{Domain: "nodeclient", Descriptors: []nodeDescriptor{
				{Entries: nodeEntries("client", v)}, {Entries: nodeEntries("trial", v)}}}
		}, overall: over,
			statuses: []nodeWantStatus{{over, 3, "MINUTE", 0}, {ok, 1, "MINUTE", 0}}, headers: nodeHdr(3, 0)},
		{name: "override 1/1", req: func(v string) nodeRequest {
			return nodeRequest{Domain: "nodeclient", Descriptors: []nodeDescriptor{
				{Entries: nodeEntries("route", v), Limit: &nodeOverride{RequestsPerUnit: 1, Unit: "MINUTE"}}}}
		}, overall: ok,
			statuses: []nodeWantStatus{{ok, 1, "MINUTE", 0}}, headers: nodeHdr(1, 0)},
		{name: "override over", req: func(v string) nodeRequest {
			return nodeRequest{Domain: "nodeclient", Descriptors: []nodeDescriptor{
				{Entries: nodeEntries("route", v), Limit: &nodeOverride{RequestsPerUnit: 1, Unit: "MINUTE"}}}}
		}, overall: over,
			statuses: []nodeWantStatus{{over, 1, "MINUTE", 0}}, headers: nodeHdr(1, 0)},
		{name: "empty domain", req: func(v string) nodeRequest {
			return nodeRequest{Domain: "", Descriptors: []nodeDescriptor{{Entries: nodeEntries("client", v)}}}
		}, grpcCode: codes.InvalidArgument},
	}
}

func TestNodeClientMatchesGo(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: runs a Node.js client (node, npm) against the service; not under -short")
	}
	node, errNode := exec.LookPath("node")
	npm, errNpm := exec.LookPath("npm")
	if errNode != nil || errNpm != nil {
		t.Skipf("skipping: needs node and npm on PATH: %v", errors.Join(errNode, errNpm))
	}
	dir := nodeClient(t, npm)

	stores := []struct {
		name string
		spec func(t *testing.T) string
	}{
		{"memory", func(*testing.T) string { return "memory" }},
		{"redis", func(t *testing.T) string {
			return "redis://" + localserver.RedisT(t, localserver.RedisOptions{}).Addr()
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			addr := startNodeService(t, st.spec(t))
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			require.NoError(t, err)
			t.Cleanup(func() { conn.Close() })
			goClient := rlsv3.NewRateLimitServiceClient(conn)
			nodeProc := startNode(t, node, dir, addr)

			// Warm both clients up (process start, connection) on a
			// descriptor no rule counts, so that each step's two calls
			// follow each other closely.
			warm := nodeOne("nothing", "warm-up")("")
			wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
			_, err = goClient.ShouldRateLimit(wctx, warm.toProto(), grpc.WaitForReady(true))
			wcancel()
			require.NoError(t, err, "go warm-up")
			require.Equal(t, codes.OK, nodeProc.ask(t, warm, time.Minute).GRPCCode, "node warm-up")

			// The windows are real minutes: keep the sequence inside one.
			nodeAwayFromMinuteEnd(t, 15*time.Second)
			minute := time.Now().Truncate(time.Minute)
			for _, step := range nodeSteps() {
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := goClient.ShouldRateLimit(ctx, step.req("go").toProto())
				cancel()
				goA := nodeGoAnswer(resp, err)
				nodeA := nodeProc.ask(t, step.req("node"), 30*time.Second)
				gap := time.Since(start)
				t.Logf("%-45s %4dms go: %s", step.name, gap.Milliseconds(), nodeCompact(goA))
				nodeCheckStep(t, step, goA, nodeA, gap)
			}
			if now := time.Now().Truncate(time.Minute); !now.Equal(minute) {
				t.Errorf("the sequence ran into the next minute (%v), where the minute windows start anew: any count mismatch above may be that", now.Format(time.TimeOnly))
			}
			nodeProc.close(t)
		})
	}
}

// nodeCheckStep asserts that Go's and Node's answers are equal, but for the
// time to reset, and as step wants. gap is how long the two calls took from
// the start of Go's to the end of Node's: the real clock moves, so the two
// times to reset may differ by that much, and by a second at least.
func nodeCheckStep(t *testing.T, step nodeStep, goA, nodeA nodeAnswer, gap time.Duration) {
	t.Helper()
	tolerance := max(time.Second, gap)
	g, n := goA, nodeA
	g.Statuses, n.Statuses = append([]nodeStatus(nil), g.Statuses...), append([]nodeStatus(nil), n.Statuses...)
	g.Headers, n.Headers = append([]nodeHeader(nil), g.Headers...), append([]nodeHeader(nil), n.Headers...)
	if len(g.Statuses) == len(n.Statuses) {
		for i := range g.Statuses {
			gr, nr := g.Statuses[i].ResetMs, n.Statuses[i].ResetMs
			if assert.Equal(t, gr == nil, nr == nil, "%s: status %d: duration_until_reset set in go, node", step.name, i) && gr != nil {
				assert.InDelta(t, *gr, *nr, float64(tolerance.Milliseconds()), "%s: status %d: duration_until_reset (ms), go and node", step.name, i)
			}
			g.Statuses[i].ResetMs, n.Statuses[i].ResetMs = nil, nil
		}
	}
	if len(g.Headers) == len(n.Headers) {
		for i := range g.Headers {
			if g.Headers[i].Key == nodeHdrReset && n.Headers[i].Key == nodeHdrReset {
				gs, err1 := strconv.Atoi(g.Headers[i].Value)
				ns, err2 := strconv.Atoi(n.Headers[i].Value)
				if assert.NoError(t, errors.Join(err1, err2), step.name) {
					assert.InDelta(t, gs, ns, math.Ceil(tolerance.Seconds()), "%s: %s header, go and node", step.name, nodeHdrReset)
				}
				g.Headers[i].Value, n.Headers[i].Value = "", ""
			}
		}
	}
	if !assert.Equal(t, g, n, "%s: go and node answers differ\ngo:   %s\nnode: %s", step.name, nodeCompact(goA), nodeCompact(nodeA)) {
		return
	}

	// The expected figures, on Go's answer (Node's is equal).
	if step.grpcCode != codes.OK {
		assert.Equal(t, step.grpcCode, goA.GRPCCode, "%s: grpc status: %s", step.name, goA.Message)
		return
	}
	if !assert.Equal(t, codes.OK, goA.GRPCCode, "%s: grpc status: %s", step.name, goA.Message) {
		return
	}
	assert.Equal(t, step.overall, goA.OverallCode, "%s: overall_code", step.name)
	if !assert.Len(t, goA.Statuses, len(step.statuses), "%s: statuses", step.name) {
		return
	}
	for i, want := range step.statuses {
		got := goA.Statuses[i]
		assert.Equal(t, want.code, got.Code, "%s: status %d code", step.name, i)
		assert.Equal(t, want.remaining, got.Remaining, "%s: status %d limit_remaining", step.name, i)
		if want.limit == 0 {
			assert.Nil(t, got.Limit, "%s: status %d current_limit", step.name, i)
			assert.Nil(t, got.ResetMs, "%s: status %d duration_until_reset", step.name, i)
			continue
		}
		if assert.NotNil(t, got.Limit, "%s: status %d current_limit", step.name, i) {
			assert.Equal(t, want.limit, got.Limit.RequestsPerUnit, "%s: status %d requests_per_unit", step.name, i)
			assert.Equal(t, want.unit, got.Limit.Unit, "%s: status %d unit", step.name, i)
		}
		if assert.NotNil(t, got.ResetMs, "%s: status %d duration_until_reset", step.name, i) {
			unit := map[string]time.Duration{"MINUTE": time.Minute, "HOUR": time.Hour}[want.unit]
			assert.Greater(t, *got.ResetMs, int64(0), "%s: status %d duration_until_reset", step.name, i)
			assert.LessOrEqual(t, *got.ResetMs, unit.Milliseconds(), "%s: status %d duration_until_reset", step.name, i)
		}
	}
	if step.headers == nil {
		assert.Empty(t, goA.Headers, "%s: response headers", step.name)
		return
	}
	if assert.Len(t, goA.Headers, 3, "%s: response headers", step.name) {
		assert.Equal(t, nodeHeader{nodeHdrLimit, strconv.FormatUint(uint64(step.headers[0]), 10)}, goA.Headers[0], step.name)
		assert.Equal(t, nodeHeader{nodeHdrRemaining, strconv.FormatUint(uint64(step.headers[1]), 10)}, goA.Headers[1], step.name)
		assert.Equal(t, nodeHdrReset, goA.Headers[2].Key, step.name)
		secs, err := strconv.Atoi(goA.Headers[2].Value)
		if assert.NoError(t, err, step.name) {
			assert.Positive(t, secs, "%s: %s", step.name, nodeHdrReset)
		}
	}
}

func nodeCompact(a nodeAnswer) string {
	b, _ := json.Marshal(a)
	return string(b)
}

// nodeAwayFromMinuteEnd waits out the last margin of the current minute (at
// most margin), so that a short sequence of requests on minute windows
// does not straddle two.
func nodeAwayFromMinuteEnd(t *testing.T, margin time.Duration) {
	t.Helper()
	now := time.Now()
	if left := now.Truncate(time.Minute).Add(time.Minute).Sub(now); left < margin {
		t.Logf("waiting %v for the next minute", left.Round(time.Millisecond))
		time.Sleep(left + 50*time.Millisecond)
	}
}

// startNodeService runs the service in process on store, with nodeConfig and
// response headers, on loopback ports, and returns its gRPC address. The
// service stops when the test ends.
func startNodeService(t *testing.T, store string) string {
	t.Helper()
	cfgDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(cfgDir, "nodeclient.yaml"), []byte(nodeConfig), 0o644))
	s := defaults()
	s.ConfigDir = cfgDir
	s.Store = store
	s.GRPCAddr, s.HTTPAddr, s.DebugAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	s.Headers = &HeadersYAML{}
	s.CallTimeout = 10 * time.Second
	s.Shutdown = 2 * time.Second
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Addrs, 1)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, &s, log, func(a Addrs) { ready <- a }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "Run")
		case <-time.After(15 * time.Second):
			t.Error("Run did not return within 15s of its context's end")
		}
	})
	select {
	case a := <-ready:
		return a.GRPC
	case err := <-done:
		t.Fatalf("Run returned before serving: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the service was not serving within 30s")
	}
	return ""
}

// nodeProcess is the Node.js client, asked one request at a time.
type nodeProcess struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *nodeLockedBuffer
	cancel context.CancelFunc
}

// nodeLockedBuffer is a bytes.Buffer safe to read while a process writes it.
type nodeLockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *nodeLockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *nodeLockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startNode starts client.js in dir against addr; it is killed when the
// test ends, if it has not exited by then.
func startNode(t *testing.T, node, dir, addr string) *nodeProcess {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, node, "client.js", addr)
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second
	p := &nodeProcess{cmd: cmd, lines: make(chan string, 1), stderr: &nodeLockedBuffer{}, cancel: cancel}
	cmd.Stderr = p.stderr
	var err error
	p.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	return p
}

// ask sends req to the Node.js client and returns its answer, failing the
// test when none comes within timeout.
func (p *nodeProcess) ask(t *testing.T, req nodeRequest, timeout time.Duration) nodeAnswer {
	t.Helper()
	b, err := json.Marshal(req)
	require.NoError(t, err)
	_, err = p.stdin.Write(append(b, '\n'))
	require.NoError(t, err, "writing to node; its stderr:\n%s", p.stderr)
	select {
	case line, ok := <-p.lines:
		if !ok {
			t.Fatalf("node exited before answering %s; its stderr:\n%s", b, p.stderr)
		}
		var a nodeAnswer
		require.NoError(t, json.Unmarshal([]byte(line), &a), "node wrote %q", line)
		if len(a.Statuses) == 0 {
			a.Statuses = nil
		}
		if len(a.Headers) == 0 {
			a.Headers = nil
		}
		return a
	case <-time.After(timeout):
		t.Fatalf("node did not answer %s within %v; its stderr:\n%s", b, timeout, p.stderr)
	}
	return nodeAnswer{}
}

// close ends the client's input and waits for it to exit cleanly.
func (p *nodeProcess) close(t *testing.T) {
	t.Helper()
	require.NoError(t, p.stdin.Close())
	for range p.lines { // drain: the channel closes at EOF
	}
	require.NoError(t, p.cmd.Wait(), "node client; its stderr:\n%s", p.stderr)
	p.cancel()
}

// nodeClient returns a temporary copy of testdata/node-client with its
// packages installed. The installed node_modules are kept under the user's
// cache directory, keyed by the package lock's hash, so that later runs
// need no npm at all.
func nodeClient(t *testing.T, npm string) string {
	t.Helper()
	work := t.TempDir()
	require.NoError(t, nodeCopyTree(nodeClientDir, work))

	lockName := "package-lock.json"
	lock, err := os.ReadFile(filepath.Join(work, lockName))
	if errors.Is(err, fs.ErrNotExist) {
		lockName = "package.json" // no lock yet: npm install makes one
		lock, err = os.ReadFile(filepath.Join(work, lockName))
	}
	require.NoError(t, err)
	sum := sha256.Sum256(lock)
	key := lockName + "-" + hex.EncodeToString(sum[:8])

	cache, err := os.UserCacheDir()
	if err != nil {
		// No cache: install in the copy itself.
		t.Logf("no user cache directory (%v): installing the node client's packages afresh", err)
		nodeNpmInstall(t, npm, work)
		return work
	}
	root := filepath.Join(cache, "throttlekit-node-client")
	cached := filepath.Join(root, key)
	if _, err := os.Stat(filepath.Join(cached, "node_modules", ".package-lock.json")); err != nil {
		require.NoError(t, os.MkdirAll(root, 0o755))
		staging, err := os.MkdirTemp(root, key+".tmp-")
		require.NoError(t, err)
		defer os.RemoveAll(staging)
		for _, name := range []string{"package.json", "package-lock.json"} {
			if b, err := os.ReadFile(filepath.Join(work, name)); err == nil {
				require.NoError(t, os.WriteFile(filepath.Join(staging, name), b, 0o644))
			}
		}
		nodeNpmInstall(t, npm, staging)
		// Another test process may have got there first: either copy will do.
		if err := os.Rename(staging, cached); err != nil {
			if _, statErr := os.Stat(filepath.Join(cached, "node_modules")); statErr != nil {
				t.Fatalf("caching the node client's packages: %v", err)
			}
		}
	}
	require.NoError(t, os.Symlink(filepath.Join(cached, "node_modules"), filepath.Join(work, "node_modules")))
	return work
}

// nodeNpmInstall installs the packages of dir: npm ci from its lock, or npm
// install when it has none.
func nodeNpmInstall(t *testing.T, npm, dir string) {
	t.Helper()
	args := []string{"ci"}
	if _, err := os.Stat(filepath.Join(dir, "package-lock.json")); err != nil {
		args = []string{"install"}
	}
	args = append(args, "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false")
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "npm %s in %s:\n%s", strings.Join(args, " "), dir, out)
	t.Logf("npm %s: %v", args[0], time.Since(start).Round(time.Millisecond))
}

// nodeCopyTree copies the regular files under src to dst, leaving out any
// node_modules.
func nodeCopyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir() && d.Name() == "node_modules":
			return filepath.SkipDir
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case !d.Type().IsRegular():
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}
