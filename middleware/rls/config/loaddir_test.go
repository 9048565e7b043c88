package config_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/middleware/rls/config"
)

// write creates files under dir, each name mapped to its contents.
func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		path := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(data), 0o644))
	}
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	rule := "descriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	write(t, dir, map[string]string{
		"b.yaml":             "domain: b\n" + rule,
		"a.yml":              "domain: a\n" + rule,
		".hidden.yaml":       "not: valid",
		"notes.txt":          "not: valid",
		"config.yaml.bak":    "not: valid",
		"sub/d.yaml":         "not: valid",
		"dir.yaml/x.yaml":    "not: valid",
		"..data/linked.yaml": "domain: linked\n" + rule,
	})
	// A ConfigMap volume's files are links into its ..data directory.
	require.NoError(t, os.Symlink(filepath.Join("..data", "linked.yaml"), filepath.Join(dir, "c.yaml")))

	cfg, err := config.LoadDir(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "linked"}, cfg.Domains())
	r := cfg.Lookup("a", d("k", "v")).Rule
	require.NotNil(t, r)
	assert.Equal(t, filepath.Join(dir, "a.yml"), r.File)
	assert.Equal(t, 4, r.Line)
}

func TestLoadDirEmpty(t *testing.T) {
	cfg, err := config.LoadDir(t.TempDir())
	require.NoError(t, err)
	assert.Empty(t, cfg.Domains())
	assert.Empty(t, cfg.Rules())
	assert.False(t, cfg.HasDomain("d"))
}

func TestLoadDirErrors(t *testing.T) {
	t.Run("missing directory", func(t *testing.T) {
		_, err := config.LoadDir(filepath.Join(t.TempDir(), "nope"))
		assert.ErrorIs(t, err, fs.ErrNotExist)
		assert.False(t, errors.Is(err, config.ErrInvalidConfig))
	})
	t.Run("bad file", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, map[string]string{"a.yaml": "domain: a\n", "b.yaml": "domain: b\ndescriptors:\n  - key: \"\"\n"})
		_, err := config.LoadDir(dir)
		assertConfigError(t, err, filepath.Join(dir, "b.yaml"), 3, 10, "descriptor key is empty")
	})
	t.Run("duplicate domain names both files", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, map[string]string{"a.yaml": "domain: d\n", "b.yaml": "domain: d\n"})
		_, err := config.LoadDir(dir)
		assertConfigError(t, err, filepath.Join(dir, "b.yaml"), 1, 9, `domain "d" is also defined in `+filepath.Join(dir, "a.yaml"))
		cfg, err := config.LoadDir(dir, config.MergeDomains(true))
		require.NoError(t, err)
		assert.Equal(t, []string{"d"}, cfg.Domains())
	})
	t.Run("file over 4 MiB", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, map[string]string{"big.yaml": "domain: d\n#" + strings.Repeat("x", 4<<20) + "\n"})
		_, err := config.LoadDir(dir)
		assertConfigError(t, err, filepath.Join(dir, "big.yaml"), 0, 0, "file is larger than 4194304 bytes")
	})
	t.Run("dangling link", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.Symlink("missing.txt", filepath.Join(dir, "a.yaml")))
		_, err := config.LoadDir(dir)
		assert.ErrorIs(t, err, fs.ErrNotExist)
		assert.False(t, errors.Is(err, config.ErrInvalidConfig))
	})
}
