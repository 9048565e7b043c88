module github.com/throttlekit/throttlekit/bench

go 1.26.0

replace github.com/throttlekit/throttlekit => ../

require (
	github.com/envoyproxy/go-control-plane/envoy v1.36.0
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/google/pprof v0.0.0-20261105003125-4bf881d7fb0b
	github.com/redis/go-redis/v9 v9.22.0
	github.com/throttled/throttled/v2 v2.15.0
	github.com/throttlekit/throttlekit v0.0.0
	github.com/ulule/limiter/v3 v3.11.2
	golang.org/x/time v0.16.0
	google.golang.org/grpc v1.80.0
)

require (
	github.com/bradfitz/gomemcache v0.0.0-20260422231931-4d751bb6e37c // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/cncf/xds/go v0.0.0-20251210132809-ee656c7534f5 // indirect
	github.com/envoyproxy/protoc-gen-validate v1.3.0 // indirect
	github.com/hashicorp/golang-lru v0.5.4 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/net v0.49.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
	golang.org/x/text v0.33.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260120221211-b8f7ae30c516 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
