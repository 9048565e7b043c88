package localserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// defaultStartTimeout bounds how long a server may take to answer its
	// first ping.
	defaultStartTimeout = 10 * time.Second
	// stopTimeout bounds a graceful stop before the process is killed. It
	// exceeds Redis's default shutdown-timeout (10 s), the longest a primary
	// waits for lagging replicas on SIGTERM.
	stopTimeout = 15 * time.Second
	// startAttempts is how many ports a server is tried on before giving up
	// when the port turns out to be taken by someone else.
	startAttempts = 5
	// logTailBytes is how much of each log file goes into error messages.
	logTailBytes = 4096
	// stderrFile is the name, in the server's directory, of the file that
	// receives the child's stdout and stderr.
	stderrFile = "stderr.log"
)

// errPortInUse marks start failures caused by another process owning the
// port; the start is then retried on a different port.
var errPortInUse = errors.New("port already in use")

// probeFunc checks whether the server at addr is up and is the process with
// the given pid. It must give up when ctx is done. It returns an error
// wrapping errPortInUse when a different server answers.
type probeFunc func(ctx context.Context, addr string, pid int) error

// process runs one server binary on a fixed address and can stop and restart
// it. It is safe for concurrent use.
type process struct {
	name         string // binary name for messages
	path         string // resolved binary
	dir          string // working directory, holds stderrFile
	args         []string
	addr         string
	logFiles     []string // tailed into error messages, besides stderrFile
	probe        probeFunc
	startTimeout time.Duration
	// killOnClose makes close use SIGKILL instead of a graceful stop, for
	// servers with nothing to flush whose graceful stop is slow.
	killOnClose bool
	// user, when set, is the account the process runs as (PostgreSQL
	// refuses to run as root).
	user *account

	mu     sync.Mutex
	cur    *run // nil when stopped
	closed bool
}

// run is one execution of the binary.
type run struct {
	cmd  *exec.Cmd
	done chan struct{} // closed after cmd.Wait returned
	err  error         // cmd.Wait's result, readable after done is closed
}

// exited reports whether the run's process has exited.
func (r *run) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// start launches the process if it is not running and waits until it answers
// the probe. On failure the process is killed.
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("%w: %s on %s", ErrClosed, p.name, p.addr)
	}
	if p.cur != nil {
		if !p.cur.exited() {
			return nil
		}
		p.cur = nil
	}
	r, err := p.launch()
	if err != nil {
		return err
	}
	if err := p.waitReady(r); err != nil {
		kill(r)
		return err
	}
	p.cur = r
	return nil
}

// launch starts the binary with stdout and stderr appended to stderrFile.
func (p *process) launch() (*run, error) {
	out, err := os.OpenFile(filepath.Join(p.dir, stderrFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("localserver: %s: %w", p.name, err)
	}
	defer out.Close() // the child has its own copy once started
	cmd := exec.Command(p.path, p.args...)
	cmd.Dir = p.dir
	cmd.Stdout = out
	cmd.Stderr = out
	setProcAttr(cmd)
	if p.user != nil {
		setUser(cmd, p.user)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("localserver: starting %s: %w", p.name, err)
	}
	r := &run{cmd: cmd, done: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		close(r.done)
	}()
	return r, nil
}

// waitReady polls the probe until it succeeds, the process exits, or the
// start timeout passes.
func (p *process) waitReady(r *run) error {
	timeout := p.startTimeout
	if timeout <= 0 {
		timeout = defaultStartTimeout
	}
	deadline := time.Now().Add(timeout)
	pid := r.cmd.Process.Pid
	// ctx ends at the deadline or as soon as the process exits, aborting a
	// probe that is stuck on whatever else answers on the port.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	go func() {
		select {
		case <-r.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	var lastErr error
	for {
		if r.exited() {
			return p.exitError(r)
		}
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		err := p.probe(pctx, p.addr, pid)
		pcancel()
		if err == nil {
			return nil
		}
		if r.exited() {
			return p.exitError(r)
		}
		if errors.Is(err, errPortInUse) {
			return fmt.Errorf("localserver: %s on %s: %w", p.name, p.addr, err)
		}
		lastErr = err
		if !time.Now().Before(deadline) {
			return fmt.Errorf("localserver: %s (pid %d) on %s not ready after %v: %v%s",
				p.name, pid, p.addr, timeout, lastErr, p.logTail())
		}
		select {
		case <-r.done:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// exitError describes a process that exited while starting.
func (p *process) exitError(r *run) error {
	tail := p.logTail()
	err := fmt.Errorf("localserver: %s on %s exited during startup (%v)%s", p.name, p.addr, r.err, tail)
	if strings.Contains(tail, "Address already in use") {
		err = fmt.Errorf("%w: %w", errPortInUse, err)
	}
	return err
}

// stop stops the process gracefully (SIGTERM, then SIGKILL after
// stopTimeout). Stopping a stopped process is a no-op. An error reports a
// process that had died on its own or had to be killed.
func (p *process) stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopLocked()
}

func (p *process) stopLocked() error {
	r := p.cur
	if r == nil {
		return nil
	}
	p.cur = nil
	if r.exited() {
		if r.err != nil {
			return fmt.Errorf("localserver: %s on %s had exited unexpectedly: %v%s", p.name, p.addr, r.err, p.logTail())
		}
		return nil
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		kill(r)
		return nil
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-r.done:
		return nil
	case <-t.C:
		kill(r)
		return fmt.Errorf("localserver: %s on %s did not stop within %v after SIGTERM; killed%s", p.name, p.addr, stopTimeout, p.logTail())
	}
}

// kill9 kills the process with SIGKILL, as a crash would, and waits for it
// to be reaped. Killing a stopped process is a no-op.
func (p *process) kill9() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.cur; r != nil {
		p.cur = nil
		if !r.exited() {
			kill(r)
		}
	}
}

// close stops the process for good; later starts fail with ErrClosed. Unlike
// stop, it does not report a process that had already died on its own (a test
// may have crashed or shut down the server on purpose).
func (p *process) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.cur != nil && (p.cur.exited() || p.killOnClose) {
		kill(p.cur)
		p.cur = nil
		return nil
	}
	return p.stopLocked()
}

// kill sends SIGKILL and waits for the process to be reaped.
func kill(r *run) {
	_ = r.cmd.Process.Kill()
	<-r.done
}

// logTail returns the ends of the process's log files, formatted for
// appending to an error message.
func (p *process) logTail() string {
	var b strings.Builder
	for _, f := range append([]string{filepath.Join(p.dir, stderrFile)}, p.logFiles...) {
		t := tailFile(f, logTailBytes)
		if strings.TrimSpace(t) == "" {
			continue
		}
		fmt.Fprintf(&b, "\n--- tail of %s ---\n%s", f, strings.TrimRight(t, "\n"))
	}
	return b.String()
}

// tailFile returns up to n bytes from the end of the named file, or "" if it
// cannot be read.
func tailFile(name string, n int64) string {
	f, err := os.Open(name)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	b, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return ""
	}
	return string(b)
}

// startOnFreePort prepares a server (reserving a port and a directory) and
// starts its process, preparing it again on a new port whenever the chosen
// one turns out to be taken, at most startAttempts times. A prepared server
// that does not start is closed. name labels the final error.
func startOnFreePort[S interface{ Close() error }](name string, prepare func() (S, *process, error)) (S, error) {
	var zero S
	var lastErr error
	for range startAttempts {
		s, proc, err := prepare()
		if err != nil {
			return zero, err
		}
		err = proc.start()
		if err == nil {
			return s, nil
		}
		_ = s.Close()
		if !errors.Is(err, errPortInUse) {
			return zero, err
		}
		lastErr = err
	}
	return zero, fmt.Errorf("localserver: %s: no usable port after %d attempts: %w", name, startAttempts, lastErr)
}
