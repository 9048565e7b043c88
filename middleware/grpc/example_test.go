package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	grpclimit "github.com/throttlekit/throttlekit/middleware/grpc"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// A gRPC server limited to 2 calls a minute per peer address; the third
// call is refused with RetryInfo.
func Example() {
	clock := throttlertest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC))
	t, err := throttler.New(memorybackend.New(), throttler.WithClock(clock))
	if err != nil {
		panic(err)
	}
	policy, err := throttler.ParsePolicy("grpc", "2/min")
	if err != nil {
		panic(err)
	}
	lim, err := grpclimit.New(t, policy, grpclimit.PeerAddress())
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for range 3 {
		var header, trailer metadata.MD
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{},
			grpc.Header(&header), grpc.Trailer(&trailer))
		st := status.Convert(err)
		fmt.Print(st.Code())
		if err == nil {
			fmt.Print(", remaining ", header.Get("x-ratelimit-remaining"))
		} else {
			fmt.Print(", remaining ", trailer.Get("x-ratelimit-remaining"))
		}
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Print(", retry in ", ri.GetRetryDelay().AsDuration())
			}
		}
		fmt.Println()
	}
	// Output:
	// OK, remaining [1]
	// OK, remaining [0]
	// ResourceExhausted, remaining [0], retry in 1m0s
}

// authUser is the context key of an authentication interceptor's user.
type authUser struct{}

// FirstOf limits a signed-in caller as its user and an anonymous one by
// its address, each name prefixed with the position of its source.
func ExampleFirstOf() {
	identify := grpclimit.FirstOf(
		grpclimit.User(func(ctx context.Context) (string, bool) {
			u, ok := ctx.Value(authUser{}).(string) // what the auth interceptor stored
			return u, ok
		}),
		grpclimit.PeerAddress())
	anon := peer.NewContext(context.Background(),
		&peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 50123}})
	signedIn := context.WithValue(anon, authUser{}, "ada")
	fmt.Println(identify(signedIn, "/pkg.Service/Method"))
	fmt.Println(identify(anon, "/pkg.Service/Method"))
	// Output:
	// 1:ada
	// 2:192.0.2.7
}
