// Command testprogress runs `go test -json` and prints what a newcomer
// watching `make test` needs: go test's own lines for each package as it
// finishes (ok, FAIL, "?" for no test files, each with its duration), the
// full output of every failing test, and, whenever nothing has been printed
// for a while (20 s unless told), which packages are still running, for how
// long, and the test each is in.
//
//	go run ./internal/testprogress -label core -list ./... -- go test -json -race ./...
//
// What it prints of a package is what go test prints without -v, when the
// package ends: the output of passing tests is dropped, and a failing
// package shows the output of each failing test (and of any test still
// running when the test binary died: a panic, a timeout), then go test's
// own FAIL lines. A line starting "!!" says at once which test failed. It ends
// with one summary line and, when anything failed, go test's closing FAIL,
// and exits with the command's status (1 if the command succeeded but a
// package failed).
//
// Flags:
//
//	-label name   names the run in progress and summary lines (the module)
//	-dir dir      runs the command in dir
//	-list pats    counts the packages `go list pats` names, to say "12 of 63"
//	-every d      the longest silence before a progress line (20s)
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	label := flag.String("label", "", "name of this run in progress lines (the module)")
	dir := flag.String("dir", "", "directory to run the command in")
	list := flag.String("list", "", "package patterns to count with go list, space-separated")
	every := flag.Duration("every", 20*time.Second, "longest silence before a progress line")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: testprogress [-label name] [-dir dir] [-list patterns] [-every d] -- go test -json [flags] [packages]")
		flag.PrintDefaults()
	}
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 || *every <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	os.Exit(run(os.Stdout, os.Stderr, *label, *dir, *list, *every, args))
}

// run runs the command and returns the exit status testprogress should end
// with. The command's stderr goes to stderr unchanged.
func run(stdout, stderr io.Writer, label, dir, list string, every time.Duration, args []string) int {
	start := time.Now()
	total := 0
	if list != "" {
		goCmd := "go"
		if filepath.Base(args[0]) == "go" {
			goCmd = args[0] // the go the command runs, as make's $(GO) names it
		}
		n, err := countPackages(stderr, goCmd, dir, strings.Fields(list))
		if err != nil {
			fmt.Fprintf(stderr, "testprogress: counting packages: %v\n", err)
		}
		total = n
	}
	p := newPrinter(stdout, label, total, start)

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintf(stderr, "testprogress: %v\n", err)
		return 2
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "testprogress: %v\n", err)
		return 2
	}

	// Ctrl-C reaches the command from the terminal; a signal sent to this
	// process alone is passed on, so that the command is never orphaned.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()

	done := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				p.tick(now, every)
			}
		}
	}()

	readErr := p.read(out)
	if readErr != nil {
		_, _ = io.Copy(io.Discard, out) // let the command finish rather than block on a full pipe
	}
	waitErr := cmd.Wait()
	close(done)
	signal.Stop(sigs)
	close(sigs)
	if readErr != nil {
		fmt.Fprintf(stderr, "testprogress: reading the command's output: %v\n", readErr)
	}

	failed := p.finish(time.Now())
	var exit *exec.ExitError
	switch {
	case errors.As(waitErr, &exit):
		if !failed {
			// Nothing failed that go test reported as an event: a
			// failure of the go command itself, said on stderr.
			fmt.Fprintf(stderr, "testprogress: %s: %v\n", strings.Join(args, " "), waitErr)
		}
		if exit.ExitCode() > 0 {
			return exit.ExitCode()
		}
		return 1 // killed by a signal
	case waitErr != nil:
		fmt.Fprintf(stderr, "testprogress: %v\n", waitErr)
		return 2
	case failed || readErr != nil:
		return 1
	}
	return 0
}

// countPackages returns how many packages `go list patterns` names in dir.
func countPackages(stderr io.Writer, goCmd, dir string, patterns []string) (int, error) {
	cmd := exec.Command(goCmd, append([]string{"list", "-e"}, patterns...)...)
	cmd.Dir = dir
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, err
	}
	return len(strings.Fields(string(out))), nil
}

// event is one line of `go test -json` (cmd/test2json's TestEvent, with
// the build events go test adds).
type event struct {
	Time       time.Time
	Action     string
	Package    string
	ImportPath string // build-output and build-fail events
	Test       string
	Output     string
	Elapsed    float64
}

// test is a test that has started and not finished.
type test struct {
	started time.Time
	paused  bool
	output  []string
}

// pkg is a package whose test binary has started and not finished.
type pkg struct {
	started time.Time
	output  []string // output outside any test, in order
	tests   map[string]*test
	failed  []string // output of the tests that failed, in the order they did
	// failedNames holds the tests that failed, to tell a parent that failed
	// because a subtest did from a test that failed itself.
	failedNames map[string]bool
}

// printer turns events into go test's non-verbose output plus progress
// lines. Its methods are safe for concurrent use: read and tick run on
// different goroutines.
type printer struct {
	mu       sync.Mutex
	w        io.Writer
	label    string
	total    int
	start    time.Time
	last     time.Time // when a line was last printed
	running  map[string]*pkg
	done     int
	ok       int
	skipped  int
	failures []string // packages that failed, in order
}

func newPrinter(w io.Writer, label string, total int, start time.Time) *printer {
	return &printer{w: w, label: label, total: total, start: start, last: start, running: map[string]*pkg{}}
}

// read decodes events from r until it ends. A line that is not an event
// (the command printed something of its own) is printed as it is.
func (p *printer) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 64*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil || ev.Action == "" {
			p.mu.Lock()
			p.print(string(line) + "\n")
			p.mu.Unlock()
			continue
		}
		if ev.Time.IsZero() {
			ev.Time = time.Now()
		}
		p.handle(ev)
	}
	return sc.Err()
}

// handle applies one event.
func (p *printer) handle(ev event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev.Action {
	case "build-output":
		p.print(ev.Output)
		return
	case "build-fail":
		return
	}
	if ev.Package == "" {
		p.print(ev.Output)
		return
	}
	k := p.running[ev.Package]
	if k == nil {
		k = &pkg{started: ev.Time, tests: map[string]*test{}}
		p.running[ev.Package] = k
	}
	if ev.Test == "" {
		p.packageEvent(ev, k)
		return
	}
	t := k.tests[ev.Test]
	if t == nil {
		t = &test{started: ev.Time}
		k.tests[ev.Test] = t
	}
	switch ev.Action {
	case "output":
		t.output = append(t.output, ev.Output)
	case "pause":
		t.paused = true
	case "cont", "run":
		t.paused = false
	case "pass", "skip":
		delete(k.tests, ev.Test)
	case "fail":
		// Its output waits for the package's end, as go test keeps a
		// package's output together; one line says now what failed.
		k.failed = append(k.failed, t.output...)
		delete(k.tests, ev.Test)
		if !k.failedSubtest(ev.Test) {
			p.print(fmt.Sprintf("!! %s: %s failed after %s; its output follows when the package ends",
				short(ev.Package), ev.Test, round(time.Duration(ev.Elapsed*float64(time.Second)))))
		}
		if k.failedNames == nil {
			k.failedNames = map[string]bool{}
		}
		k.failedNames[ev.Test] = true
	}
}

// failedSubtest reports whether a subtest of name has failed.
func (k *pkg) failedSubtest(name string) bool {
	for n := range k.failedNames {
		if strings.HasPrefix(n, name+"/") {
			return true
		}
	}
	return false
}

// packageEvent applies an event outside any test.
func (p *printer) packageEvent(ev event, k *pkg) {
	switch ev.Action {
	case "output":
		k.output = append(k.output, ev.Output)
		return
	case "pass", "skip":
		// go test without -v shows its summary line only: "ok  pkg 1.2s"
		// or "?   pkg [no test files]".
		summary := ""
		for _, line := range k.output {
			if strings.HasPrefix(line, "ok  \t"+ev.Package) || strings.HasPrefix(line, "?   \t"+ev.Package) {
				summary = line
			}
		}
		if summary == "" && ev.Action == "pass" {
			summary = fmt.Sprintf("ok  \t%s\t%.3fs", ev.Package, ev.Elapsed)
		}
		p.print(summary)
		if ev.Action == "pass" {
			p.ok++
		} else {
			p.skipped++
		}
	case "fail":
		p.printTest(k.failed)
		// Tests still running when the package ended died with the
		// binary (a panic, a timeout): their output says why.
		names := make([]string, 0, len(k.tests))
		for name := range k.tests {
			names = append(names, name)
		}
		slices.SortFunc(names, func(a, b string) int { return k.tests[a].started.Compare(k.tests[b].started) })
		for _, name := range names {
			p.printTest(k.tests[name].output)
		}
		p.printTest(k.output)
		p.failures = append(p.failures, ev.Package)
	default:
		return // start, and anything a later Go adds
	}
	p.done++
	delete(p.running, ev.Package)
}

// printTest prints a failing test's output without the framing lines of
// -v ("=== RUN", "=== PAUSE", ...), as go test without -v shows it.
func (p *printer) printTest(lines []string) {
	for _, line := range lines {
		if strings.HasPrefix(line, "=== ") {
			continue
		}
		p.print(line)
	}
}

// print writes s; the caller holds p.mu.
func (p *printer) print(s string) {
	if s == "" {
		return
	}
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	_, _ = io.WriteString(p.w, s)
	p.last = time.Now()
}

// tick prints a progress line when nothing was printed for every.
func (p *printer) tick(now time.Time, every time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.last) < every {
		return
	}
	p.print(p.progress(now))
}

// progress describes the run at now: how many packages are done, and each
// running package with its time so far and the test that has run longest
// without finishing.
func (p *printer) progress(now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, ".. %s%s: %d", p.prefix(), round(now.Sub(p.start)), p.done)
	if p.total > 0 {
		fmt.Fprintf(&b, " of %d", p.total)
	}
	b.WriteString(" packages done")
	if len(p.failures) > 0 {
		fmt.Fprintf(&b, " (%d failed)", len(p.failures))
	}
	if len(p.running) == 0 {
		b.WriteString("; building")
		return b.String()
	}
	names := make([]string, 0, len(p.running))
	for name := range p.running {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int { return p.running[a].started.Compare(p.running[b].started) })
	b.WriteString("; running ")
	for i, name := range names {
		k := p.running[name]
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", short(name), round(now.Sub(k.started)))
		if t, at := k.current(); t != "" {
			fmt.Fprintf(&b, " (%s %s)", t, round(now.Sub(at)))
		}
	}
	return b.String()
}

// current returns the running test, not paused and with no running
// subtest, that started first: where a slow or hung package is.
func (k *pkg) current() (string, time.Time) {
	var name string
	var at time.Time
	for n, t := range k.tests {
		if t.paused || k.hasRunningSubtest(n) {
			continue
		}
		if name == "" || t.started.Before(at) || t.started.Equal(at) && n < name {
			name, at = n, t.started
		}
	}
	return name, at
}

func (k *pkg) hasRunningSubtest(name string) bool {
	for n, t := range k.tests {
		if !t.paused && strings.HasPrefix(n, name+"/") {
			return true
		}
	}
	return false
}

// finish prints the summary line, and go test's closing FAIL when a
// package failed; it reports whether one did.
func (p *printer) finish(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A package that started and never ended: the command died.
	names := make([]string, 0, len(p.running))
	for name := range p.running {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		k := p.running[name]
		p.printTest(k.failed)
		for _, t := range k.tests {
			p.printTest(t.output)
		}
		p.printTest(k.output)
		p.print(fmt.Sprintf("FAIL\t%s\t(no result: the test binary's output ended)", name))
		p.failures = append(p.failures, name)
		p.done++
	}
	p.running = map[string]*pkg{}

	msg := fmt.Sprintf("== %s%d packages in %s: %d ok, %d without tests, %d failed",
		p.prefix(), p.done, round(now.Sub(p.start)), p.ok, p.skipped, len(p.failures))
	if len(p.failures) > 0 {
		names := make([]string, len(p.failures))
		for i, f := range p.failures {
			names[i] = short(f)
		}
		msg += ": " + strings.Join(names, ", ")
	}
	p.print(msg)
	if len(p.failures) > 0 {
		p.print("FAIL")
		return true
	}
	return false
}

func (p *printer) prefix() string {
	if p.label == "" {
		return ""
	}
	return p.label + " "
}

// modulePath is trimmed from package paths in progress lines; go test's own
// lines keep the full path.
const modulePath = "github.com/throttlekit/throttlekit/"

func short(name string) string {
	if s := strings.TrimPrefix(name, modulePath); s != "" {
		return s
	}
	return name
}

// round prints d to the second, as 1m05s.
func round(d time.Duration) string {
	d = d.Round(time.Second)
	if d < time.Minute {
		return fmt.Sprintf("%ds", int(d/time.Second))
	}
	return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
}
