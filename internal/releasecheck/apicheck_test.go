package releasecheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// run runs name with args in dir, bounded in time, and returns its output
// and whether it succeeded.
func run(t *testing.T, dir string, env []string, name string, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	done := make(chan struct{})
	timer := time.AfterFunc(5*time.Minute, func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	close(done)
	return string(out), err == nil
}

func write(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

// TestAPICheck: a release whose throttler package had one more exported
// function; the work tree without it fails the check, naming it; the same
// work tree passes once CHANGELOG.md announces the removal, and an unchanged
// API passes.
func TestAPICheck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the module's API twice; skipped under -short")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	files, ok := run(t, root, nil, "git", "ls-files", "--cached", "--others", "--exclude-standard")
	require.True(t, ok, files)
	repo := t.TempDir()
	for _, f := range strings.Split(strings.TrimSpace(files), "\n") {
		data, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue // deleted in the work tree
		}
		require.NoError(t, err)
		write(t, filepath.Join(repo, f), string(data))
	}
	require.NoError(t, os.Chmod(filepath.Join(repo, "scripts", "apicheck.sh"), 0o755))
	git := func(args ...string) {
		out, ok := run(t, repo, []string{"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t"}, "git", args...)
		require.True(t, ok, out)
	}
	probe := filepath.Join(repo, "throttler", "releaseprobe.go")
	write(t, probe, "package throttler\n\n// ReleaseCheckProbe is an exported function the test removes.\nfunc ReleaseCheckProbe() {}\n")
	changelog := filepath.Join(repo, "CHANGELOG.md")
	write(t, changelog, "# Changelog\n\n## Unreleased\n\n## v9.9.9\n\nThe release the test compares with.\n")
	git("init", "-q")
	git("add", "-A")
	git("commit", "-q", "-m", "release v9.9.9")
	check := func() (string, bool) {
		return run(t, repo, []string{"APICHECK_MODULES=."}, "bash", "scripts/apicheck.sh")
	}

	out, ok := check()
	assert.True(t, ok, "an unchanged API passes:\n%s", out)

	require.NoError(t, os.Remove(probe))
	out, ok = check()
	assert.False(t, ok, "a removed exported function fails:\n%s", out)
	assert.Contains(t, out, "ReleaseCheckProbe")
	assert.Contains(t, out, "throttler.ReleaseCheckProbe")

	write(t, changelog, "# Changelog\n\n## Unreleased\n\n### Breaking\n\n- `throttler.ReleaseCheckProbe` is gone.\n\n## v9.9.9\n\nThe release the test compares with.\n")
	out, ok = check()
	assert.True(t, ok, "the removal announced passes:\n%s", out)
}
