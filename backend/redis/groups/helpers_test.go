package redisgroups

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

var t0 = time.Date(2030, time.January, 2, 3, 4, 0, 0, time.UTC)

func mustPolicy(tb testing.TB, name, limits string, opts ...throttler.Option) *throttler.Policy {
	tb.Helper()
	p, err := throttler.ParsePolicy(name, limits, opts...)
	require.NoError(tb, err)
	return p
}

func identifiers(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	return ids
}

// compile returns the backend's view of p as a throttler sends it, an
// unnamed limit (one Limits shows by its notation) without a name, so that
// the keys a test computes are those a throttler writes.
func compile(tb testing.TB, p *throttler.Policy) *driver.Policy {
	tb.Helper()
	var limits []driver.Limit
	for _, l := range p.Limits() {
		name := l.Name
		if name == l.String() {
			name = ""
		}
		dl, err := driver.NewLimit(name, l.Algorithm, l.Max, l.Window, l.Burst)
		require.NoError(tb, err)
		limits = append(limits, dl)
	}
	dp, err := driver.NewPolicy(p.Name(), limits...)
	require.NoError(tb, err)
	return dp
}
