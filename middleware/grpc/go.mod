module github.com/throttlekit/throttlekit/middleware/grpc

go 1.24.0

require github.com/throttlekit/throttlekit v0.1.0

require (
	github.com/stretchr/testify v1.12.1
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260120221211-b8f7ae30c516
	google.golang.org/grpc v1.80.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/go-logr/logr v1.4.4 // indirect
	go.opentelemetry.io/otel v1.41.0 // indirect
	go.opentelemetry.io/otel/sdk/metric v1.41.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.50.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
	golang.org/x/text v0.34.0 // indirect
)

// Developed and tested with the core at the same commit.
replace github.com/throttlekit/throttlekit => ../..
