package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// stream builds a go test -json stream: each entry is action, package,
// test, output, seconds after t0.
func stream(t *testing.T, events ...event) string {
	t.Helper()
	var b strings.Builder
	for _, ev := range events {
		line, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

func ev(sec int, action, pkg, test, output string) event {
	return event{Time: t0.Add(time.Duration(sec) * time.Second), Action: action, Package: pkg, Test: test, Output: output}
}

const (
	pkgA = "github.com/throttlekit/throttlekit/backend/redis"
	pkgB = "github.com/throttlekit/throttlekit/conformance"
)

func TestPassingPackagePrintsOnlyItsSummaryLine(t *testing.T) {
	var out strings.Builder
	p := newPrinter(&out, "core", 1, t0)
	in := stream(t,
		ev(0, "start", pkgA, "", ""),
		ev(0, "output", pkgA, "", "started redis on 127.0.0.1:1234\n"),
		ev(0, "run", pkgA, "TestX", ""),
		ev(0, "output", pkgA, "TestX", "=== RUN   TestX\n"),
		ev(0, "output", pkgA, "TestX", "    x_test.go:1: a log line\n"),
		ev(1, "output", pkgA, "TestX", "--- PASS: TestX (1.00s)\n"),
		ev(1, "pass", pkgA, "TestX", ""),
		ev(1, "output", pkgA, "", "PASS\n"),
		ev(1, "output", pkgA, "", "ok  \t"+pkgA+"\t1.234s\n"),
		ev(1, "pass", pkgA, "", ""),
	)
	if err := p.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if p.finish(t0.Add(2 * time.Second)) {
		t.Error("finish reported a failure")
	}
	want := "ok  \t" + pkgA + "\t1.234s\n" +
		"== core 1 packages in 2s: 1 ok, 0 without tests, 0 failed\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestFailingTestPrintsItsOutputAndGoTestsFailLines(t *testing.T) {
	var out strings.Builder
	p := newPrinter(&out, "", 0, t0)
	in := stream(t,
		ev(0, "start", pkgA, "", ""),
		ev(0, "run", pkgA, "TestOK", ""),
		ev(0, "output", pkgA, "TestOK", "    ok_test.go:1: not shown\n"),
		ev(0, "pass", pkgA, "TestOK", ""),
		ev(0, "run", pkgA, "TestBad", ""),
		ev(0, "output", pkgA, "TestBad", "=== RUN   TestBad\n"),
		ev(0, "run", pkgA, "TestBad/sub", ""),
		ev(0, "output", pkgA, "TestBad/sub", "=== RUN   TestBad/sub\n"),
		ev(0, "output", pkgA, "TestBad/sub", "    bad_test.go:9: boom\n"),
		ev(0, "output", pkgA, "TestBad/sub", "        second line\n"),
		ev(0, "output", pkgA, "TestBad/sub", "--- FAIL: TestBad/sub (0.00s)\n"),
		ev(0, "fail", pkgA, "TestBad/sub", ""),
		ev(0, "output", pkgA, "TestBad", "--- FAIL: TestBad (0.00s)\n"),
		ev(0, "fail", pkgA, "TestBad", ""),
		ev(0, "output", pkgA, "", "FAIL\n"),
		ev(0, "output", pkgA, "", "FAIL\t"+pkgA+"\t0.010s\n"),
		ev(0, "fail", pkgA, "", ""),
	)
	if err := p.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if !p.finish(t0.Add(time.Second)) {
		t.Error("finish reported no failure")
	}
	want := "!! backend/redis: TestBad/sub failed after 0s; its output follows when the package ends\n" +
		"    bad_test.go:9: boom\n" +
		"        second line\n" +
		"--- FAIL: TestBad/sub (0.00s)\n" +
		"--- FAIL: TestBad (0.00s)\n" +
		"FAIL\n" +
		"FAIL\t" + pkgA + "\t0.010s\n" +
		"== 1 packages in 1s: 0 ok, 0 without tests, 1 failed: backend/redis\n" +
		"FAIL\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestBinaryThatDiesShowsTheRunningTestsOutput(t *testing.T) {
	var out strings.Builder
	p := newPrinter(&out, "", 0, t0)
	in := stream(t,
		ev(0, "start", pkgA, "", ""),
		ev(0, "run", pkgA, "TestHang", ""),
		ev(0, "output", pkgA, "TestHang", "    hang_test.go:3: before\n"),
		ev(9, "output", pkgA, "TestHang", "panic: test timed out after 9s\n"),
		ev(9, "output", pkgA, "", "FAIL\t"+pkgA+"\t9.012s\n"),
		ev(9, "fail", pkgA, "", ""),
	)
	if err := p.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	p.finish(t0.Add(10 * time.Second))
	for _, want := range []string{"hang_test.go:3: before\npanic: test timed out after 9s\nFAIL\t" + pkgA + "\t9.012s\n", "1 failed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestBuildFailureAndOtherLinesPassThrough(t *testing.T) {
	var out strings.Builder
	p := newPrinter(&out, "", 0, t0)
	in := `{"ImportPath":"example.com/c","Action":"build-output","Output":"# example.com/c\n"}
{"ImportPath":"example.com/c","Action":"build-output","Output":"c/c.go:2:23: cannot use \"x\"\n"}
{"ImportPath":"example.com/c","Action":"build-fail"}
not json at all
` + stream(t,
		ev(0, "start", "example.com/c", "", ""),
		ev(0, "output", "example.com/c", "", "FAIL\texample.com/c [build failed]\n"),
		ev(0, "fail", "example.com/c", "", ""),
		ev(0, "start", "example.com/d", "", ""),
		ev(0, "output", "example.com/d", "", "?   \texample.com/d\t[no test files]\n"),
		ev(0, "skip", "example.com/d", "", ""),
	)
	if err := p.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	p.finish(t0)
	want := "# example.com/c\n" +
		"c/c.go:2:23: cannot use \"x\"\n" +
		"not json at all\n" +
		"FAIL\texample.com/c [build failed]\n" +
		"?   \texample.com/d\t[no test files]\n" +
		"== 2 packages in 0s: 0 ok, 1 without tests, 1 failed: example.com/c\n" +
		"FAIL\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestProgressNamesRunningPackagesAndTheirCurrentTest(t *testing.T) {
	var out strings.Builder
	p := newPrinter(&out, "core", 63, t0)
	p.last = time.Now()
	in := stream(t,
		ev(0, "start", pkgA, "", ""),
		ev(0, "run", pkgA, "TestConformance", ""),
		ev(5, "run", pkgA, "TestConformance/GCRATimeline", ""),
		ev(6, "pass", pkgA, "TestConformance/GCRATimeline", ""),
		ev(10, "run", pkgA, "TestConformance/ConcurrentGCRAExact", ""),
		ev(10, "run", pkgA, "TestParallel", ""),
		ev(10, "pause", pkgA, "TestParallel", ""),
		ev(20, "start", pkgB, "", ""),
		ev(30, "start", "github.com/throttlekit/throttlekit/throttler", "", ""),
		ev(31, "output", "github.com/throttlekit/throttlekit/throttler", "", "ok  \tgithub.com/throttlekit/throttlekit/throttler\t1.000s\n"),
		ev(31, "pass", "github.com/throttlekit/throttlekit/throttler", "", ""),
	)
	if err := p.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	out.Reset()

	// Not silent long enough: nothing.
	p.tick(p.last.Add(19*time.Second), 20*time.Second)
	if out.Len() != 0 {
		t.Fatalf("a progress line after 19 s of silence: %q", out.String())
	}
	p.tick(p.last.Add(20*time.Second), 20*time.Second)
	if out.Len() == 0 {
		t.Fatal("no progress line after 20 s of silence")
	}

	got := p.progress(t0.Add(100 * time.Second))
	want := ".. core 1m40s: 1 of 63 packages done; running backend/redis 1m40s (TestConformance/ConcurrentGCRAExact 1m30s), conformance 1m20s"
	if got != want {
		t.Errorf("progress:\n%s\nwant:\n%s", got, want)
	}

	p2 := newPrinter(&out, "", 0, t0)
	if got, want := p2.progress(t0.Add(5*time.Second)), ".. 5s: 0 packages done; building"; got != want {
		t.Errorf("progress = %q, want %q", got, want)
	}
}

func TestUnfinishedPackageFails(t *testing.T) {
	var out strings.Builder
	p := newPrinter(&out, "", 0, t0)
	in := stream(t,
		ev(0, "start", pkgA, "", ""),
		ev(0, "run", pkgA, "TestX", ""),
		ev(0, "output", pkgA, "TestX", "    x_test.go:1: last words\n"),
	)
	if err := p.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if !p.finish(t0) {
		t.Fatal("a package with no result did not fail the run")
	}
	for _, want := range []string{"last words", "FAIL\t" + pkgA + "\t(no result", "1 failed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestRunExitStatus runs real commands: the command's own failure is the
// exit status, and a failed package fails a command that exited 0.
func TestRunExitStatus(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	failing := filepath.Join(dir, "failing.json")
	if err := os.WriteFile(failing, []byte(stream(t,
		ev(0, "start", pkgA, "", ""),
		ev(0, "output", pkgA, "", "FAIL\t"+pkgA+"\t0.1s\n"),
		ev(0, "fail", pkgA, "", ""),
	)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		script string
		want   int
	}{
		{"true", 0},
		{"exit 3", 3},
		{fmt.Sprintf("cat %q", failing), 1},
		{fmt.Sprintf("cat %q; exit 1", failing), 1},
	} {
		var stdout, stderr strings.Builder
		if got := run(&stdout, &stderr, "", dir, "", time.Minute, []string{"sh", "-c", c.script}); got != c.want {
			t.Errorf("%s: exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", c.script, got, c.want, stdout.String(), stderr.String())
		}
		if c.want == 3 && !strings.Contains(stderr.String(), "exit status 3") {
			t.Errorf("%s: stderr does not say why it failed: %q", c.script, stderr.String())
		}
	}
}

func TestRound(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                              "0s",
		1499 * time.Millisecond:        "1s",
		59 * time.Second:               "59s",
		65 * time.Second:               "1m05s",
		20*time.Minute + 3*time.Second: "20m03s",
	} {
		if got := round(d); got != want {
			t.Errorf("round(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestFailureOutputStaysWithItsPackage: while another package runs, a
// failing test's output waits for its package's end, as go test keeps a
// package's output together, and one line names the failure at once.
func TestFailureOutputStaysWithItsPackage(t *testing.T) {
	var out strings.Builder
	p := newPrinter(&out, "core", 0, t0)
	in := stream(t,
		ev(0, "start", pkgA, "", ""),
		ev(0, "start", pkgB, "", ""),
		ev(1, "run", pkgA, "TestBad", ""),
		ev(1, "output", pkgA, "TestBad", "    bad_test.go:1: A's failure\n"),
		ev(1, "output", pkgA, "TestBad", "--- FAIL: TestBad (1.50s)\n"),
		event{Time: t0.Add(2 * time.Second), Action: "fail", Package: pkgA, Test: "TestBad", Elapsed: 1.5},
		ev(3, "output", pkgB, "", "ok  \t"+pkgB+"\t3.000s\n"),
		ev(3, "pass", pkgB, "", ""),
		ev(4, "output", pkgA, "", "FAIL\n"),
		ev(4, "output", pkgA, "", "FAIL\t"+pkgA+"\t4.000s\n"),
		ev(4, "fail", pkgA, "", ""),
	)
	if err := p.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	want := "!! backend/redis: TestBad failed after 2s; its output follows when the package ends\n" +
		"ok  \t" + pkgB + "\t3.000s\n" +
		"    bad_test.go:1: A's failure\n" +
		"--- FAIL: TestBad (1.50s)\n" +
		"FAIL\n" +
		"FAIL\t" + pkgA + "\t4.000s\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
