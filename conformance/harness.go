package conformance

import (
	"context"
	"testing"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Harness makes backends for one subtest. Every backend one harness makes
// shares state with the others, as several processes sharing one store do:
// the suite builds two throttlers with different clocks over two backends
// of one harness and expects them to agree.
type Harness interface {
	// MakeBackend returns a backend over the harness's store.
	MakeBackend(ctx context.Context) (driver.Backend, error)
	// Close releases what the harness holds. The suite calls it once, after
	// the subtest, whatever happened.
	Close()
}

// HarnessMaker returns a fresh harness for one subtest or benchmark. State
// must not leak from one harness to the next: use a new key prefix, a
// flushed server or a new in-memory store.
type HarnessMaker func(ctx context.Context, tb testing.TB) (Harness, error)
