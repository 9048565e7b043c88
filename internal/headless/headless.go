package headless

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/internal/localserver"
)

// ErrNotFound is returned (wrapped) when no Chromium binary can be found.
var ErrNotFound = errors.New("headless: chromium not found")

// Binaries looked up in PATH, in order, unless $CHROMIUM names one.
var binaries = []string{"chromium", "chromium-browser", "google-chrome"}

// DefaultTimeout bounds one run of the browser: its start takes seconds on
// a loaded machine.
const DefaultTimeout = 2 * time.Minute

// LookPath returns the Chromium binary: $CHROMIUM, or the first of
// chromium, chromium-browser and google-chrome in PATH. The error wraps
// ErrNotFound.
func LookPath() (string, error) {
	if env := os.Getenv("CHROMIUM"); env != "" {
		p, err := exec.LookPath(env)
		if err != nil {
			return "", fmt.Errorf("%w: $CHROMIUM=%q: %v", ErrNotFound, env, err)
		}
		return p, nil
	}
	for _, name := range binaries {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: none of %s in PATH (apt-get install chromium, or set $CHROMIUM)", ErrNotFound,
		strings.Join(binaries, ", "))
}

// RequireT returns a Browser for the test, whose profiles live in the
// test's temporary directory. Without a Chromium it skips the test, or
// fails it when localserver.RequireServers is true (CI).
func RequireT(tb testing.TB) *Browser {
	tb.Helper()
	bin, err := LookPath()
	if err != nil {
		if localserver.RequireServers() {
			tb.Fatalf("%v", err)
		}
		tb.Skipf("skipping: %v (set CI or THROTTLEKIT_REQUIRE_SERVERS=1 to fail instead)", err)
	}
	return &Browser{Path: bin, Dir: tb.TempDir()}
}

// Browser runs one Chromium binary.
type Browser struct {
	// Path is the binary.
	Path string
	// Dir holds a fresh profile directory per run.
	Dir  string
	runs int
}

// Page is what a page showed once loaded.
type Page struct {
	// DOM is the document as serialised after load (--dump-dom).
	DOM string
	// Console holds the page's console messages and uncaught errors, one
	// per line, as Chromium logs them ("Uncaught ReferenceError: ...").
	Console []string
}

// consoleLine matches Chromium's log of a console message or an uncaught
// error: `[...:INFO:CONSOLE:12] "Uncaught ...", source: file:///... (12)`.
var consoleLine = regexp.MustCompile(`:CONSOLE(?:\(\d+\))?:?\d*\] (.*)$`)

// Load opens url, waits for it to load, and returns its DOM and console
// messages. width and height set the window, as for a screenshot.
func (b *Browser) Load(ctx context.Context, url string, width, height int) (Page, error) {
	stdout, stderr, err := b.run(ctx, width, height, "--dump-dom", url)
	p := Page{DOM: stdout}
	for _, line := range strings.Split(stderr, "\n") {
		if m := consoleLine.FindStringSubmatch(line); m != nil {
			p.Console = append(p.Console, m[1])
		} else if strings.Contains(line, "Uncaught") {
			p.Console = append(p.Console, line)
		}
	}
	if err != nil {
		return p, err
	}
	if !strings.Contains(p.DOM, "</html>") {
		return p, fmt.Errorf("headless: %s: no document in the DOM dump (%d bytes); browser log:\n%s", url, len(p.DOM),
			lastLines(stderr, 20))
	}
	return p, nil
}

// Screenshot opens url in a window of width × height and writes a PNG of
// it to png.
func (b *Browser) Screenshot(ctx context.Context, url, png string, width, height int) error {
	_, stderr, err := b.run(ctx, width, height, "--screenshot="+png, url)
	if err != nil {
		return err
	}
	if fi, statErr := os.Stat(png); statErr != nil || fi.Size() == 0 {
		return fmt.Errorf("headless: no screenshot of %s at %s; browser log:\n%s", url, png, lastLines(stderr, 20))
	}
	return nil
}

// run runs the browser once, headless, with a fresh profile, no network
// of its own (no proxy, no background or component updates, no QUIC),
// logging console messages to stderr.
func (b *Browser) run(ctx context.Context, width, height int, args ...string) (stdout, stderr string, err error) {
	b.runs++
	profile := fmt.Sprintf("%s/profile-%d", b.Dir, b.runs)
	ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-proxy-server",
		"--disable-extensions", "--hide-scrollbars", "--user-data-dir=" + profile,
		"--enable-logging=stderr", "--v=0", fmt.Sprintf("--window-size=%d,%d", width, height)}
	cmd := exec.CommandContext(ctx, b.Path, append(base, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return out.String(), errOut.String(), fmt.Errorf("headless: %s %s: %w; browser log:\n%s", b.Path,
			strings.Join(args, " "), err, lastLines(errOut.String(), 20))
	}
	return out.String(), errOut.String(), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
