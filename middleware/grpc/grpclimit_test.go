package grpclimit_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/middleware"
	grpclimit "github.com/throttlekit/throttlekit/middleware/grpc"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

const (
	checkMethod = "/grpc.health.v1.Health/Check"
	watchMethod = "/grpc.health.v1.Health/Watch"
)

// serve starts a real gRPC server with the health service on a loopback
// port, with opts (its interceptors), and returns a client connected to it.
func serve(t *testing.T, opts ...grpc.ServerOption) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// serveLimited serves the health service behind lim's two interceptors.
func serveLimited(t *testing.T, lim *grpclimit.Limiter) healthpb.HealthClient {
	t.Helper()
	return serve(t, grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
}

var check = &healthpb.HealthCheckRequest{}

func retryDelay(t *testing.T, err error) (time.Duration, bool) {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok)
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

func quotaFailure(t *testing.T, err error) *errdetails.QuotaFailure {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok {
			return q
		}
	}
	return nil
}

// lastDecision records the last decision a throttler made, as its
// observer sees it.
type lastDecision struct {
	mu sync.Mutex
	r  throttler.Result
}

func (d *lastDecision) Observe(_ context.Context, e throttler.Event) {
	if e.Op == "allow" {
		d.mu.Lock()
		d.r = e.Result
		d.mu.Unlock()
	}
}

func (d *lastDecision) get() throttler.Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.r
}

// TestUnaryEndToEnd: allowed calls carry the figures in their header
// metadata; the call over the limit is ResourceExhausted with a RetryInfo
// whose delay is the Result's RetryAfter, a QuotaFailure, and the figures
// in its trailer metadata; the caller is its peer address.
func TestUnaryEndToEnd(t *testing.T) {
	clock, withClock := testkit.Clock()
	var last lastDecision
	th := testkit.Throttler(t, memorybackend.New(), withClock, throttler.WithObserver(&last))
	p := testkit.Policy(t, "grpc", "2/min")
	lim, err := grpclimit.New(th, p, grpclimit.PeerAddress())
	require.NoError(t, err)
	client := serveLimited(t, lim)
	ctx := context.Background()
	reset := strconv.FormatInt(testkit.T0.Add(time.Minute).Truncate(time.Second).Unix()+1, 10) // rounded up

	for i, want := range []struct{ remaining, used, ratelimit string }{
		{"1", "1", `"grpc";r=1;t=60`},
		{"0", "2", `"grpc";r=0;t=50`},
	} {
		var header, trailer metadata.MD
		_, err := client.Check(ctx, check, grpc.Header(&header), grpc.Trailer(&trailer))
		require.NoError(t, err, "call %d", i)
		assert.Equal(t, []string{want.remaining}, header.Get("x-ratelimit-remaining"), "call %d", i)
		assert.Equal(t, []string{want.used}, header.Get("x-ratelimit-used"), "call %d", i)
		assert.Equal(t, []string{"2"}, header.Get("x-ratelimit-limit"))
		assert.Equal(t, []string{reset}, header.Get("x-ratelimit-reset"))
		assert.Equal(t, []string{"grpc"}, header.Get("x-ratelimit-resource"))
		assert.Equal(t, []string{`"grpc";q=2;w=60`}, header.Get("ratelimit-policy"))
		assert.Equal(t, []string{want.ratelimit}, header.Get("ratelimit"), "call %d", i)
		assert.Empty(t, header.Get("retry-after"))
		assert.Empty(t, trailer.Get("x-ratelimit-remaining"), "an allowed call's figures are in its header")
		clock.Advance(10 * time.Second)
	}
	clock.Advance(5 * time.Second) // 25 s into the window

	var header, trailer metadata.MD
	_, err = client.Check(ctx, check, grpc.Header(&header), grpc.Trailer(&trailer))
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	denial := last.get()
	require.False(t, denial.Allowed)
	require.Equal(t, 35*time.Second, denial.RetryAfter)
	delay, ok := retryDelay(t, err)
	require.True(t, ok, "a denial carries RetryInfo")
	assert.Equal(t, denial.RetryAfter, delay, "RetryInfo holds the Result's RetryAfter")
	assert.Equal(t, []string{"0"}, trailer.Get("x-ratelimit-remaining"))
	assert.Equal(t, []string{"2"}, trailer.Get("x-ratelimit-used"))
	assert.Equal(t, []string{"2"}, trailer.Get("x-ratelimit-limit"))
	assert.Equal(t, []string{reset}, trailer.Get("x-ratelimit-reset"))
	assert.Equal(t, []string{"grpc"}, trailer.Get("x-ratelimit-resource"))
	assert.Equal(t, []string{`"grpc";q=2;w=60`}, trailer.Get("ratelimit-policy"))
	assert.Equal(t, []string{`"grpc";r=0;t=35`}, trailer.Get("ratelimit"))
	assert.Equal(t, []string{"35"}, trailer.Get("retry-after"))
	assert.Empty(t, header.Get("x-ratelimit-remaining"), "a refused call's figures are in its trailer")

	q := quotaFailure(t, err)
	require.NotNil(t, q)
	require.Len(t, q.GetViolations(), 1)
	assert.Equal(t, "grpc", q.GetViolations()[0].GetSubject())
	assert.Contains(t, q.GetViolations()[0].GetDescription(), "2/min")
	assert.NotContains(t, status.Convert(err).Message(), "127.0.0.1", "the identifier is not in the message")

	// The peer address was the identifier.
	r, err := th.Peek(ctx, p, "127.0.0.1")
	require.NoError(t, err)
	assert.EqualValues(t, 2, r.Used)

	// The window ends; calls are allowed again.
	clock.Advance(35 * time.Second)
	_, err = client.Check(ctx, check)
	require.NoError(t, err)
}

// TestStreamDecidedWhenItOpens: a Watch stream is one call, decided when
// it opens; the second is refused before its handler runs. The caller is
// its API key.
func TestStreamDecidedWhenItOpens(t *testing.T) {
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	lim, err := grpclimit.New(th, testkit.Policy(t, "watch", "1/min"), grpclimit.Metadata("X-API-Key"))
	require.NoError(t, err)
	var mu sync.Mutex
	var seen []throttler.Result
	record := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if r, ok := grpclimit.ResultFromContext(ss.Context()); ok {
			mu.Lock()
			seen = append(seen, r)
			mu.Unlock()
		}
		return handler(srv, ss)
	}
	client := serve(t, grpc.ChainStreamInterceptor(lim.StreamServerInterceptor(), record))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "key-1")

	cctx, cancel := context.WithCancel(ctx)
	stream, err := client.Watch(cctx, check)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err, "the first stream is served")
	header, err := stream.Header()
	require.NoError(t, err)
	assert.Equal(t, []string{"0"}, header.Get("x-ratelimit-remaining"))
	assert.Equal(t, []string{`"watch";r=0;t=60`}, header.Get("ratelimit"))
	cancel()

	stream, err = client.Watch(ctx, check)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	delay, ok := retryDelay(t, err)
	require.True(t, ok)
	assert.Equal(t, time.Minute, delay)
	assert.Equal(t, []string{"0"}, stream.Trailer().Get("x-ratelimit-remaining"))
	assert.Equal(t, []string{"60"}, stream.Trailer().Get("retry-after"))
	mu.Lock()
	require.Len(t, seen, 1, "the refused stream never reached the handler")
	assert.Equal(t, "key-1", seen[0].Identifier, "the handler's stream carries the decision")
	mu.Unlock()

	// Another key has its own quota; no key at all is not limited.
	other := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "key-2")
	stream, err = client.Watch(other, check)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)
	for range 3 {
		stream, err = client.Watch(context.Background(), check)
		require.NoError(t, err)
		_, err = stream.Recv()
		require.NoError(t, err, "a stream without a key is not limited")
	}
	r, err := th.Peek(context.Background(), testkit.Policy(t, "watch", "1/min"), "key-1")
	require.NoError(t, err)
	assert.EqualValues(t, 1, r.Used)
}

type userKey struct{}

func userFromContext(ctx context.Context) (string, bool) {
	u, ok := ctx.Value(userKey{}).(string)
	return u, ok
}

// authenticate stands for the service's authentication interceptor: it
// puts the user a bearer token names in the context.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if vs := metadata.ValueFromIncomingContext(ctx, "authorization"); len(vs) > 0 {
		if u, ok := strings.CutPrefix(vs[0], "Bearer "); ok {
			ctx = context.WithValue(ctx, userKey{}, u)
		}
	}
	return handler(ctx, req)
}

func as(user string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+user)
}

// TestIdentifiersEndToEnd: the user an authentication interceptor found,
// falling back to the peer address; each source has counters of its own.
func TestIdentifiersEndToEnd(t *testing.T) {
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	anon := context.Background()

	t.Run("user", func(t *testing.T) {
		lim, err := grpclimit.New(th, testkit.Policy(t, "users", "1/min"), grpclimit.User(userFromContext))
		require.NoError(t, err)
		client := serve(t, grpc.ChainUnaryInterceptor(authenticate, lim.UnaryServerInterceptor()))
		_, err = client.Check(as("ada"), check)
		require.NoError(t, err)
		_, err = client.Check(as("ada"), check)
		require.Equal(t, codes.ResourceExhausted, status.Code(err))
		_, err = client.Check(as("bob"), check)
		require.NoError(t, err, "another user has a quota of their own")
		for range 3 {
			_, err = client.Check(anon, check)
			require.NoError(t, err, "an anonymous call is not limited by user")
		}
	})

	t.Run("user, else peer", func(t *testing.T) {
		p := testkit.Policy(t, "callers", "1/min")
		lim, err := grpclimit.New(th, p, grpclimit.FirstOf(grpclimit.User(userFromContext), grpclimit.PeerAddress()))
		require.NoError(t, err)
		client := serve(t, grpc.ChainUnaryInterceptor(authenticate, lim.UnaryServerInterceptor()))
		_, err = client.Check(as("ada"), check)
		require.NoError(t, err)
		_, err = client.Check(anon, check)
		require.NoError(t, err, "the anonymous caller is limited by its address, apart from ada")
		_, err = client.Check(anon, check)
		require.Equal(t, codes.ResourceExhausted, status.Code(err))
		_, err = client.Check(as("ada"), check)
		require.Equal(t, codes.ResourceExhausted, status.Code(err))
		for id, used := range map[string]int64{"1:ada": 1, "2:127.0.0.1": 1} {
			r, err := th.Peek(anon, p, id)
			require.NoError(t, err)
			assert.Equal(t, used, r.Used, id)
		}
	})

	t.Run("a key cannot spend an address's quota", func(t *testing.T) {
		lim, err := grpclimit.New(th, testkit.Policy(t, "keys", "1/min"),
			grpclimit.FirstOf(grpclimit.Metadata("x-api-key"), grpclimit.PeerAddress()))
		require.NoError(t, err)
		client := serveLimited(t, lim)
		spoof := metadata.AppendToOutgoingContext(anon, "x-api-key", "127.0.0.1")
		_, err = client.Check(spoof, check)
		require.NoError(t, err)
		_, err = client.Check(anon, check)
		require.NoError(t, err, "the address 127.0.0.1 has spent nothing")
	})
}

// addr is a net.Addr of any network and text.
type addr struct{ network, s string }

func (a addr) Network() string { return a.network }
func (a addr) String() string  { return a.s }

// TestIdentifierFuncs: what each IdentifierFunc names, without a server.
func TestIdentifierFuncs(t *testing.T) {
	ctx := context.Background()
	withPeer := func(a net.Addr) context.Context { return peer.NewContext(ctx, &peer.Peer{Addr: a}) }
	for _, c := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 443}, "192.0.2.7"}, // 16-byte form of IPv4
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 443, Zone: "eth0"}, "2001:db8::1"},
		{addr{"tcp", "[::ffff:192.0.2.8]:1234"}, "192.0.2.8"},
		{addr{"tcp", "[fe80::1%eth0]:1234"}, "fe80::1"},
		{addr{"tcp", "host.example:1234"}, "host.example"},
		{&net.UnixAddr{Name: "/run/app.sock", Net: "unix"}, "/run/app.sock"},
		{nil, ""},
	} {
		assert.Equal(t, c.want, grpclimit.PeerAddress()(withPeer(c.addr), checkMethod), "%v", c.addr)
	}
	assert.Equal(t, "", grpclimit.PeerAddress()(ctx, checkMethod))

	in := metadata.NewIncomingContext(ctx, metadata.Pairs("x-api-key", "k1", "x-api-key", "k2"))
	assert.Equal(t, "k1", grpclimit.Metadata("X-Api-Key")(in, checkMethod), "the first value, any case")
	assert.Equal(t, "", grpclimit.Metadata("x-api-key")(ctx, checkMethod))

	assert.Equal(t, "", grpclimit.User(nil)(ctx, checkMethod))
	assert.Equal(t, "", grpclimit.User(userFromContext)(ctx, checkMethod))
	assert.Equal(t, "ada", grpclimit.User(userFromContext)(context.WithValue(ctx, userKey{}, "ada"), checkMethod))

	f := grpclimit.FirstOf(nil, grpclimit.User(userFromContext), grpclimit.Metadata("x-api-key"))
	assert.Equal(t, "", f(ctx, checkMethod))
	assert.Equal(t, "2:ada", f(context.WithValue(in, userKey{}, "ada"), checkMethod))
	assert.Equal(t, "3:k1", f(in, checkMethod))
	assert.Equal(t, "", grpclimit.FirstOf()(in, checkMethod))
}

type down struct{}

func (down) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, syscall.ECONNREFUSED
}

// TestFailureModes: a failed store serves calls under FailOpen, marked
// degraded, and refuses them with Unavailable and RetryInfo under
// FailClosed, for unary calls and streams alike.
func TestFailureModes(t *testing.T) {
	ctx := context.Background()
	p := testkit.Policy(t, "grpc", "5/min")

	open := testkit.Throttler(t, down{}, throttler.WithLogger(nil))
	lim, err := grpclimit.New(open, p, grpclimit.PeerAddress())
	require.NoError(t, err)
	client := serveLimited(t, lim)
	var header metadata.MD
	_, err = client.Check(ctx, check, grpc.Header(&header))
	require.NoError(t, err)
	assert.Equal(t, []string{"1"}, header.Get("x-ratelimit-degraded"))
	assert.Equal(t, []string{"5"}, header.Get("x-ratelimit-limit"))
	assert.Empty(t, header.Get("x-ratelimit-remaining"), "a degraded result's counts are not the store's")
	stream, err := client.Watch(ctx, check)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)

	closed := testkit.Throttler(t, down{}, throttler.WithLogger(nil), throttler.WithFailureMode(throttler.FailClosed))
	lim, err = grpclimit.New(closed, p, grpclimit.PeerAddress())
	require.NoError(t, err)
	client = serveLimited(t, lim)
	var trailer metadata.MD
	_, err = client.Check(ctx, check, grpc.Trailer(&trailer))
	require.Equal(t, codes.Unavailable, status.Code(err))
	delay, ok := retryDelay(t, err)
	require.True(t, ok)
	assert.Equal(t, time.Second, delay)
	assert.Nil(t, quotaFailure(t, err), "no quota was checked")
	assert.Equal(t, []string{"1"}, trailer.Get("x-ratelimit-degraded"))
	assert.Equal(t, []string{"1"}, trailer.Get("retry-after"))
	stream, err = client.Watch(ctx, check)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err))
}

// TestNeverAllowed: a cost above the quota is ResourceExhausted with a
// QuotaFailure and nothing that invites the call back.
func TestNeverAllowed(t *testing.T) {
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	lim, err := grpclimit.New(th, testkit.Policy(t, "grpc", "5/min"), grpclimit.PeerAddress(),
		grpclimit.WithCost(func(_ context.Context, m string) int64 {
			if m == checkMethod {
				return 6
			}
			return 1
		}))
	require.NoError(t, err)
	client := serveLimited(t, lim)
	var trailer metadata.MD
	_, err = client.Check(context.Background(), check, grpc.Trailer(&trailer))
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	_, ok := retryDelay(t, err)
	assert.False(t, ok, "a call that can never fit is not invited back")
	q := quotaFailure(t, err)
	require.NotNil(t, q)
	assert.Equal(t, "grpc", q.GetViolations()[0].GetSubject())
	assert.Contains(t, status.Convert(err).Message(), "never")
	assert.Empty(t, trailer.Get("retry-after"))
	assert.Equal(t, []string{`"grpc";r=0`}, trailer.Get("ratelimit"))

	stream, err := client.Watch(context.Background(), check)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err, "the cost is per method")
}

// TestPerMethodPolicies: WithPolicies gives each method its policy, or
// none; WithMethods leaves methods out; a multi-limit policy names the
// binding limit.
func TestPerMethodPolicies(t *testing.T) {
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	checks := testkit.Policy(t, "check", "5/s, 1/min")
	lim, err := grpclimit.New(th, nil, grpclimit.PeerAddress(),
		grpclimit.WithPolicies(func(m string) *throttler.Policy {
			if m == checkMethod {
				return checks
			}
			return nil
		}))
	require.NoError(t, err)
	client := serveLimited(t, lim)
	ctx := context.Background()
	var header metadata.MD
	_, err = client.Check(ctx, check, grpc.Header(&header))
	require.NoError(t, err)
	assert.Equal(t, []string{`"check:5/s";q=5;w=1, "check:1/min";q=1;w=60`}, header.Get("ratelimit-policy"))
	_, err = client.Check(ctx, check)
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	q := quotaFailure(t, err)
	require.NotNil(t, q)
	assert.Equal(t, "check:1/min", q.GetViolations()[0].GetSubject())
	for range 3 {
		stream, err := client.Watch(ctx, check)
		require.NoError(t, err)
		_, err = stream.Recv()
		require.NoError(t, err, "a method without a policy is not limited")
	}

	lim, err = grpclimit.New(th, testkit.Policy(t, "some", "1/min"), grpclimit.PeerAddress(),
		grpclimit.WithMethods(func(m string) bool { return m != checkMethod }))
	require.NoError(t, err)
	client = serveLimited(t, lim)
	for range 3 {
		_, err = client.Check(ctx, check)
		require.NoError(t, err, "a method left out is not limited")
	}
	stream, err := client.Watch(ctx, check)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)
	stream, err = client.Watch(ctx, check)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
}

// TestResultFromContext: the handler sees the decision that let the call
// in; an unlimited call has none.
func TestResultFromContext(t *testing.T) {
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	lim, err := grpclimit.New(th, testkit.Policy(t, "grpc", "3/min"), grpclimit.Metadata("x-api-key"))
	require.NoError(t, err)
	var mu sync.Mutex
	var got []int64
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		mu.Lock()
		if r, ok := grpclimit.ResultFromContext(ctx); ok {
			got = append(got, r.Remaining)
		} else {
			got = append(got, -1)
		}
		mu.Unlock()
		return handler(ctx, req)
	}
	client := serve(t, grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor(), record))
	key := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k")
	for _, ctx := range []context.Context{key, key, context.Background()} {
		_, err := client.Check(ctx, check)
		require.NoError(t, err)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int64{2, 1, -1}, got)
}

// TestErrors: input the throttler rejects is InvalidArgument, a context
// that ended its own status, a broken throttler Internal; the handler
// never runs, and nothing panics.
func TestErrors(t *testing.T) {
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	p := testkit.Policy(t, "grpc", "3/min")
	served := 0
	handler := func(context.Context, any) (any, error) { served++; return nil, nil }
	call := func(lim *grpclimit.Limiter, ctx context.Context) codes.Code {
		_, err := lim.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod}, handler)
		return status.Code(err)
	}
	key := func(k string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", k))
	}

	lim, err := grpclimit.New(th, p, grpclimit.Metadata("x-api-key"))
	require.NoError(t, err)
	assert.Equal(t, codes.InvalidArgument, call(lim, key(strings.Repeat("k", driver.MaxIdentifierLen+1))))
	canceled, cancel := context.WithCancel(key("k"))
	cancel()
	assert.Equal(t, codes.Canceled, call(lim, canceled))

	negative, err := grpclimit.New(th, p, grpclimit.Metadata("x-api-key"),
		grpclimit.WithCost(func(context.Context, string) int64 { return -1 }))
	require.NoError(t, err)
	assert.Equal(t, codes.InvalidArgument, call(negative, key("k")))

	zero, err := grpclimit.New(&throttler.Throttler{}, p, grpclimit.Metadata("x-api-key"))
	require.NoError(t, err)
	assert.Equal(t, codes.Internal, call(zero, key("k")))
	assert.Zero(t, served)

	// Without a UnaryServerInfo or a transport stream, the call is still
	// decided.
	_, err = lim.UnaryServerInterceptor()(key("k"), nil, nil, handler)
	require.NoError(t, err)
	assert.Equal(t, 1, served)
}

// TestBadOptions: every misconfiguration is an error New returns.
func TestBadOptions(t *testing.T) {
	th := testkit.Throttler(t, memorybackend.New())
	p := testkit.Policy(t, "grpc", "5/min")
	_, err := grpclimit.New(nil, p, grpclimit.PeerAddress())
	assert.ErrorIs(t, err, throttler.ErrNotInitialized)
	_, err = grpclimit.New(th, nil, grpclimit.PeerAddress())
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	_, err = grpclimit.New(th, &throttler.Policy{}, grpclimit.PeerAddress())
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	_, err = grpclimit.New(th, p, nil)
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	for _, o := range []grpclimit.Option{nil, grpclimit.WithCost(nil), grpclimit.WithMethods(nil), grpclimit.WithPolicies(nil)} {
		_, err = grpclimit.New(th, p, grpclimit.PeerAddress(), o)
		assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	}
	_, err = grpclimit.New(th, nil, grpclimit.PeerAddress(),
		grpclimit.WithPolicies(func(string) *throttler.Policy { return p }))
	assert.NoError(t, err, "WithPolicies stands in for the policy")
}

// TestHeaderOptions: the resource renames the figures and the quota, and
// families can be left out, as in the net/http middleware.
func TestHeaderOptions(t *testing.T) {
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	lim, err := grpclimit.New(th, testkit.Policy(t, "grpc", "1/min"), grpclimit.PeerAddress(),
		grpclimit.WithHeaderOptions(middleware.HeaderOptions{Resource: "health", OmitGitHub: true}))
	require.NoError(t, err)
	client := serveLimited(t, lim)
	var header, trailer metadata.MD
	_, err = client.Check(context.Background(), check, grpc.Header(&header))
	require.NoError(t, err)
	assert.Equal(t, []string{`"health";q=1;w=60`}, header.Get("ratelimit-policy"))
	assert.Equal(t, []string{`"health";r=0;t=60`}, header.Get("ratelimit"))
	assert.Empty(t, header.Get("x-ratelimit-limit"))
	_, err = client.Check(context.Background(), check, grpc.Trailer(&trailer))
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, []string{`"health";q=1;w=60`}, trailer.Get("ratelimit-policy"))
	assert.Empty(t, trailer.Get("x-ratelimit-resource"))
	assert.Equal(t, "health", quotaFailure(t, err).GetViolations()[0].GetSubject())
}

// A broken call is logged where the throttler logs (throttler.WithLogger),
// not to slog.Default(); WithLogger(nil) silences it.
func TestErrorsLogToTheThrottlersLogger(t *testing.T) {
	var buf, def bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&def, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	handler := func(context.Context, any) (any, error) { return nil, nil }
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "k"))
	for _, logger := range []*slog.Logger{slog.New(slog.NewTextHandler(&buf, nil)), nil} {
		buf.Reset()
		_, clock := testkit.Clock()
		th := testkit.Throttler(t, memorybackend.New(), clock, throttler.WithLogger(logger))
		// A Policy not built by NewPolicy or ParsePolicy: the throttler
		// refuses it, which is the Limiter's own error.
		lim, err := grpclimit.New(th, nil, grpclimit.Metadata("x-api-key"),
			grpclimit.WithPolicies(func(string) *throttler.Policy { return &throttler.Policy{} }))
		require.NoError(t, err)
		_, err = lim.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod}, handler)
		assert.Equal(t, codes.Internal, status.Code(err))
		assert.NotContains(t, def.String(), "rate limiter error", "logged to slog.Default()")
		if logger == nil {
			assert.Empty(t, buf.String())
		} else {
			assert.Contains(t, buf.String(), "throttlekit: grpclimit: rate limiter error")
		}
	}
}
