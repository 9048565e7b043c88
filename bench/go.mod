module github.com/throttlekit/throttlekit/bench

go 1.26.0

replace github.com/throttlekit/throttlekit => ../

require (
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/redis/go-redis/v9 v9.22.0
	github.com/throttled/throttled/v2 v2.15.0
	github.com/throttlekit/throttlekit v0.0.0
	github.com/ulule/limiter/v3 v3.11.2
	golang.org/x/time v0.16.0
)

require (
	github.com/bradfitz/gomemcache v0.0.0-20260422231931-4d751bb6e37c // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/hashicorp/golang-lru v0.5.4 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
)
