package rollout

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// A bad option is reported by the option itself, wraps
// driver.ErrInvalidOption and reads "throttlekit: ...".
func TestBadOptionsAreErrors(t *testing.T) {
	src, err := NewStaticSource(0)
	require.NoError(t, err)
	for name, opt := range map[string]Option{
		"nil":              nil,
		"unknown mode":     WithMode(Mode(9)),
		"unknown side":     WithDefaultSide(Side(-1)),
		"no seed memory":   WithSeedMemory(0),
		"negative entries": WithSeedMemory(-5),
	} {
		b, err := New(memorybackend.New(), memorybackend.New(), src, opt)
		assert.Nil(t, b, name)
		require.ErrorIs(t, err, driver.ErrInvalidOption, name)
		assert.True(t, strings.HasPrefix(err.Error(), "throttlekit: "), "%s: %v", name, err)
	}
	_, err = NewStaticSource(10, nil)
	require.ErrorIs(t, err, driver.ErrInvalidOption)
	assert.True(t, strings.HasPrefix(ErrSecondary.Error(), "throttlekit: rollout: "))
}
