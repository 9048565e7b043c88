package grpclimit_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	grpclimit "github.com/throttlekit/throttlekit/middleware/grpc"
)

// BenchmarkUnaryInterceptor: the interceptor around a handler that does
// nothing, beside the bare Allow it makes, on the memory backend (the
// transport is not measured).
func BenchmarkUnaryInterceptor(b *testing.B) {
	p := testkit.Policy(b, "grpc", "1000000000/h")
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 50123}})
	// The server's stream, where the interceptor sets the header metadata.
	ctx = grpc.NewContextWithServerTransportStream(ctx, nopStream{})
	b.Run("bare-allow", func(b *testing.B) {
		th := testkit.Throttler(b, memorybackend.New())
		b.ReportAllocs()
		for b.Loop() {
			if _, err := th.Allow(ctx, p, "10.0.0.7"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("interceptor", func(b *testing.B) {
		th := testkit.Throttler(b, memorybackend.New())
		lim, err := grpclimit.New(th, p, grpclimit.PeerAddress())
		if err != nil {
			b.Fatal(err)
		}
		icpt := lim.UnaryServerInterceptor()
		info := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
		handler := func(context.Context, any) (any, error) { return nil, nil }
		b.ReportAllocs()
		for b.Loop() {
			if _, err := icpt(ctx, nil, info, handler); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// nopStream is a grpc.ServerTransportStream that keeps nothing.
type nopStream struct{}

func (nopStream) Method() string               { return "/grpc.health.v1.Health/Check" }
func (nopStream) SetHeader(metadata.MD) error  { return nil }
func (nopStream) SendHeader(metadata.MD) error { return nil }
func (nopStream) SetTrailer(metadata.MD) error { return nil }
