package conformance

import (
	"context"
	"crypto/rand"
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

// UniquePrefix returns a key prefix for one harness, at most 40 bytes of
// ASCII letters and digits only: the last 24 letters and digits of tb's
// name, for whoever reads the store, then 16 random ones (from crypto/rand's
// Text: 80 bits), so that no other harness of this run, nor of an earlier
// run against the same server, has used it. Any store accepts it as a key
// part, NATS KV included, which refuses the '/' of a subtest's name and
// ':'; join it to the rest of a key with the store's own separator:
//
//	prefix := conformance.UniquePrefix(tb) + "."
func UniquePrefix(tb testing.TB) string {
	name := tb.Name()
	keep := make([]byte, 0, 24)
	for i := len(name) - 1; i >= 0 && len(keep) < cap(keep); i-- {
		if c := name[i]; c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			keep = append(keep, c)
		}
	}
	for i, j := 0, len(keep)-1; i < j; i, j = i+1, j-1 {
		keep[i], keep[j] = keep[j], keep[i]
	}
	return string(keep) + rand.Text()[:16]
}
