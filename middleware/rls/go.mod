module github.com/throttlekit/throttlekit/middleware/rls

go 1.24.0

require (
	github.com/Unleash/unleash-client-go/v4 v4.5.0
	github.com/envoyproxy/go-control-plane/envoy v1.36.0
	github.com/fsnotify/fsnotify v1.9.0
	github.com/prometheus/client_golang v1.23.2
	github.com/redis/go-redis/v9 v9.22.0
	github.com/stretchr/testify v1.12.1
	github.com/throttlekit/throttlekit v0.1.0
	github.com/throttlekit/throttlekit/observe/prometheus v0.1.0
	go.yaml.in/yaml/v3 v3.0.5
	google.golang.org/grpc v1.80.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/Masterminds/semver/v3 v3.3.1 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/bradfitz/gomemcache v0.0.0-20260422231931-4d751bb6e37c // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/cncf/xds/go v0.0.0-20251210132809-ee656c7534f5 // indirect
	github.com/envoyproxy/protoc-gen-validate v1.3.0 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.66.1 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	github.com/stretchr/objx v0.5.3 // indirect
	github.com/twmb/murmur3 v1.1.8 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/net v0.49.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
	golang.org/x/text v0.33.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260120221211-b8f7ae30c516 // indirect
)

// Developed and tested with the core at the same commit.
replace github.com/throttlekit/throttlekit => ../..

replace github.com/throttlekit/throttlekit/observe/prometheus => ../../observe/prometheus
