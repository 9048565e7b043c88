package upgradetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// builds holds the probe built for each release during this test binary's
// run, in a directory TestMain removes.
var (
	buildDir string
	buildsMu sync.Mutex
	builds   = map[string]*build{}
)

type build struct {
	once sync.Once
	path string
	err  error
	skip string
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "throttlekit-upgradetest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// releaseProbe returns the path of the probe program built from commit's
// source, building it on first use. It skips tb when the repository's
// history lacks the commit (a shallow clone) or git is missing; CI clones
// the whole history.
func releaseProbe(tb testing.TB, commit string) string {
	tb.Helper()
	buildsMu.Lock()
	b, ok := builds[commit]
	if !ok {
		b = &build{}
		builds[commit] = b
	}
	buildsMu.Unlock()
	b.once.Do(func() { b.path, b.skip, b.err = buildRelease(commit) })
	switch {
	case b.skip != "":
		tb.Skip(b.skip)
	case b.err != nil:
		tb.Fatalf("building release %s: %v", commit, b.err)
	}
	return b.path
}

func buildRelease(commit string) (path, skip string, err error) {
	if _, err := exec.LookPath("git"); err != nil {
		return "", "git is not installed: the upgrade tests build earlier releases from the repository's history", nil
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", "not inside a git work tree: the upgrade tests build earlier releases from the repository's history", nil
	}
	root := strings.TrimSpace(string(top))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		return "", fmt.Sprintf("commit %s is not in this clone's history (a shallow clone?): fetch the full history to run the upgrade tests", commit), nil
	}
	src := filepath.Join(buildDir, commit)
	if err := os.MkdirAll(filepath.Join(src, "cmd", "upgradeprobe"), 0o755); err != nil {
		return "", "", err
	}
	var archive bytes.Buffer
	gitArchive := exec.Command("git", "-C", root, "archive", commit)
	gitArchive.Stdout = &archive
	if err := run(gitArchive); err != nil {
		return "", "", err
	}
	untar := exec.Command("tar", "-x", "-C", src)
	untar.Stdin = &archive
	if err := run(untar); err != nil {
		return "", "", err
	}
	probe, err := os.ReadFile(filepath.Join("testdata", "probe", "main.go"))
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(filepath.Join(src, "cmd", "upgradeprobe", "main.go"), probe, 0o644); err != nil {
		return "", "", err
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", "the go command is not in PATH: the upgrade tests build earlier releases with it", nil
	}
	path = filepath.Join(buildDir, "probe-"+commit)
	goBuild := exec.Command(goCmd, "build", "-o", path, "./cmd/upgradeprobe")
	goBuild.Dir = src
	// The release's own go.mod and go.sum; modules come from the cache or
	// the proxy, as for any build.
	goBuild.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if err := run(goBuild); err != nil {
		return "", "", err
	}
	return path, "", nil
}

func run(cmd *exec.Cmd) error {
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, tail(stderr.String()))
	}
	return nil
}

func tail(s string) string {
	if len(s) > 2000 {
		return "..." + s[len(s)-2000:]
	}
	return s
}

// oldProcess is a running probe of an earlier release.
type oldProcess struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stderr  bytes.Buffer
	done    chan struct{}
	recs    []record
	readErr error
}

// probeArgs are the probe's flags.
type probeArgs struct {
	store, addrs, ids string
	n, spread         int
	every             time.Duration
}

// startOld starts the probe at path; it runs until stop (or 2 minutes).
func startOld(path string, a probeArgs) (*oldProcess, error) {
	cmd := exec.Command(path, "-store", a.store, "-addrs", a.addrs, "-ids", a.ids,
		"-n", fmt.Sprint(a.n), "-spread", fmt.Sprint(a.spread), "-every", a.every.String(),
		"-for", "2m", "-proc", "old",
		// Wider than the default 100 ms, so that a loaded machine does
		// not turn decisions into degraded ones the upgrade has no part in.
		"-timeout", "5s")
	p := &oldProcess{cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &p.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.stdin = stdin
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				p.readErr = fmt.Errorf("line %q: %w", sc.Text(), err)
				continue
			}
			p.recs = append(p.recs, r)
		}
	}()
	return p, nil
}

// stop closes the probe's input, which ends its loop, and waits for it to
// exit (killing it after 30 s); it returns every record it printed.
func (p *oldProcess) stop() ([]record, error) {
	_ = p.stdin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	select {
	case <-p.done:
	case <-ctx.Done():
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if err := p.cmd.Wait(); err != nil {
		return p.recs, fmt.Errorf("old release exited: %w: %s", err, tail(p.stderr.String()))
	}
	if p.readErr != nil {
		return p.recs, fmt.Errorf("reading the old release's output: %w", p.readErr)
	}
	return p.recs, nil
}
