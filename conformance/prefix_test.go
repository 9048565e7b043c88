package conformance_test

import (
	"regexp"
	"testing"

	"github.com/throttlekit/throttlekit/conformance"
)

func TestUniquePrefix(t *testing.T) {
	alnum := regexp.MustCompile(`^[A-Za-z0-9]+$`)
	seen := map[string]bool{}
	for _, name := range []string{"a/b:c d", "ConcurrentGCRAExact", "x{y}.z..", "very/long/subtest/name/that/goes/on/and/on/and/on"} {
		t.Run(name, func(t *testing.T) {
			for range 100 {
				p := conformance.UniquePrefix(t)
				if !alnum.MatchString(p) || len(p) > 40 {
					t.Fatalf("UniquePrefix = %q: want at most 40 letters and digits", p)
				}
				if seen[p] {
					t.Fatalf("UniquePrefix gave %q twice", p)
				}
				seen[p] = true
			}
		})
	}
	t.Run("keeps the end of the name", func(t *testing.T) {
		if p := conformance.UniquePrefix(t); p[:24] != "efixkeepstheendofthename" || len(p) != 40 {
			t.Errorf("UniquePrefix = %q", p)
		}
	})
}
