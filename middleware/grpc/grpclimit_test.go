package grpclimit_test

import (
	"context"
	"net"
	"strconv"
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
	"google.golang.org/grpc/status"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	grpclimit "github.com/throttlekit/throttlekit/middleware/grpc"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// serve starts a real gRPC server with the health service behind lim on a
// loopback port and returns a client connected to it.
func serve(t *testing.T, lim *grpclimit.Limiter) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

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

// TestUnaryEndToEnd: allowed calls carry the figures in their header
// metadata; the call over the limit is ResourceExhausted with RetryInfo and
// the figures in its trailer metadata, limited by peer address.
func TestUnaryEndToEnd(t *testing.T) {
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	p := testkit.Policy(t, "grpc", "2/min")
	lim, err := grpclimit.New(th, p, grpclimit.PeerAddress())
	require.NoError(t, err)
	client := serve(t, lim)
	ctx := context.Background()

	for i, remaining := range []string{"1", "0"} {
		var header metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		require.NoError(t, err, "call %d", i)
		assert.Equal(t, []string{remaining}, header.Get("x-ratelimit-remaining"), "call %d", i)
		assert.Equal(t, []string{"2"}, header.Get("x-ratelimit-limit"))
		assert.Equal(t, []string{"grpc"}, header.Get("x-ratelimit-resource"))
		assert.Equal(t, []string{`"grpc";q=2;w=60`}, header.Get("ratelimit-policy"))
	}
	var trailer metadata.MD
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	delay, ok := retryDelay(t, err)
	require.True(t, ok, "a denial carries RetryInfo")
	assert.Equal(t, time.Minute, delay)
	assert.Equal(t, []string{"0"}, trailer.Get("x-ratelimit-remaining"))
	assert.Equal(t, []string{"2"}, trailer.Get("x-ratelimit-used"))
	assert.Equal(t, []string{"60"}, trailer.Get("retry-after"))
	reset := testkit.T0.Add(time.Minute).Add(time.Second - 1).Truncate(time.Second).Unix() // rounded up
	assert.Equal(t, []string{strconv.FormatInt(reset, 10)}, trailer.Get("x-ratelimit-reset"))
	st, _ := status.FromError(err)
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok {
			quota = q
		}
	}
	require.NotNil(t, quota)
	assert.Equal(t, "grpc", quota.GetViolations()[0].GetSubject())
	assert.NotContains(t, st.Message(), "127.0.0.1", "the identifier is not in the message")

	// The peer address was the identifier: the throttler holds 127.0.0.1.
	r, err := th.Peek(ctx, p, "127.0.0.1")
	require.NoError(t, err)
	assert.EqualValues(t, 2, r.Used)
}

// TestStreamDecidedWhenItOpens: a Watch stream is one call; the second is
// refused when it opens.
func TestStreamDecidedWhenItOpens(t *testing.T) {
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	lim, err := grpclimit.New(th, testkit.Policy(t, "watch", "1/min"), grpclimit.Metadata("X-API-Key"))
	require.NoError(t, err)
	client := serve(t, lim)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "key-1")

	cctx, cancel := context.WithCancel(ctx)
	stream, err := client.Watch(cctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err, "the first stream is served")
	header, err := stream.Header()
	require.NoError(t, err)
	assert.Equal(t, []string{"0"}, header.Get("x-ratelimit-remaining"))
	cancel()

	stream, err = client.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, []string{"0"}, stream.Trailer().Get("x-ratelimit-remaining"))

	// Another key has its own quota; no key at all is not limited.
	other := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "key-2")
	_, err = client.Check(other, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	for range 3 {
		_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		require.NoError(t, err, "a call without a key is not limited")
	}
}

type userKey struct{}

// TestIdentifiers: the user from the context, falling back to the peer.
func TestIdentifiers(t *testing.T) {
	f := grpclimit.FirstOf(nil, grpclimit.User(func(ctx context.Context) (string, bool) {
		u, ok := ctx.Value(userKey{}).(string)
		return u, ok
	}), grpclimit.Metadata("x-api-key"))
	ctx := context.Background()
	assert.Equal(t, "", f(ctx, "/m"))
	assert.Equal(t, "ada", f(context.WithValue(ctx, userKey{}, "ada"), "/m"))
	in := metadata.NewIncomingContext(ctx, metadata.Pairs("x-api-key", "k"))
	assert.Equal(t, "k", f(in, "/m"))
	assert.Equal(t, "", grpclimit.PeerAddress()(ctx, "/m"))
	assert.Equal(t, "", grpclimit.User(nil)(ctx, "/m"))
}

type down struct{}

func (down) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, syscall.ECONNREFUSED
}

// TestFailureModes: a failed store serves calls under FailOpen and refuses
// them with Unavailable and RetryInfo under FailClosed; a cost above the
// quota is ResourceExhausted without RetryInfo; unlimited methods pass.
func TestFailureModes(t *testing.T) {
	ctx := context.Background()
	p := testkit.Policy(t, "grpc", "5/min")
	open := testkit.Throttler(t, down{}, throttler.WithLogger(nil))
	lim, err := grpclimit.New(open, p, grpclimit.PeerAddress())
	require.NoError(t, err)
	var header metadata.MD
	_, err = serve(t, lim).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	require.NoError(t, err)
	assert.Equal(t, []string{"1"}, header.Get("x-ratelimit-degraded"))

	closed := testkit.Throttler(t, down{}, throttler.WithLogger(nil), throttler.WithFailureMode(throttler.FailClosed))
	lim, err = grpclimit.New(closed, p, grpclimit.PeerAddress())
	require.NoError(t, err)
	_, err = serve(t, lim).Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, ok := retryDelay(t, err)
	assert.True(t, ok)

	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	lim, err = grpclimit.New(th, p, grpclimit.PeerAddress(),
		grpclimit.WithCost(func(context.Context, string) int64 { return 6 }),
		grpclimit.WithMethods(func(m string) bool { return m != "/grpc.health.v1.Health/Watch" }))
	require.NoError(t, err)
	client := serve(t, lim)
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	_, ok = retryDelay(t, err)
	assert.False(t, ok, "a call that can never fit is not invited back")
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err, "an unlimited method is served")
}

func TestBadOptions(t *testing.T) {
	th := testkit.Throttler(t, memorybackend.New())
	p := testkit.Policy(t, "grpc", "5/min")
	_, err := grpclimit.New(nil, p, grpclimit.PeerAddress())
	assert.ErrorIs(t, err, throttler.ErrNotInitialized)
	_, err = grpclimit.New(th, nil, grpclimit.PeerAddress())
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	_, err = grpclimit.New(th, p, nil)
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	for _, o := range []grpclimit.Option{nil, grpclimit.WithCost(nil), grpclimit.WithMethods(nil)} {
		_, err = grpclimit.New(th, p, grpclimit.PeerAddress(), o)
		assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	}
}
