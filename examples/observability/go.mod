module github.com/throttlekit/throttlekit/examples/observability

go 1.24.0

require (
	github.com/throttlekit/throttlekit v0.1.0
	github.com/throttlekit/throttlekit/observe/prometheus v0.1.0
)

require github.com/prometheus/client_golang v1.23.2

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.66.1 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/sys v0.41.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// Built and run with the core and the Prometheus collector at the same commit.
replace (
	github.com/throttlekit/throttlekit => ../..
	github.com/throttlekit/throttlekit/observe/prometheus => ../../observe/prometheus
)
