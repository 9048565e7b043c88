package redisgroups

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
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
