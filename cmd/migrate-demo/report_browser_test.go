package main

import (
	"bytes"
	"context"
	"fmt"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/headless"
)

// screenshotDirEnv names a directory where the browser tests keep their
// screenshots, to be looked at; without it they go to the test's
// temporary directory.
const screenshotDirEnv = "THROTTLEKIT_SCREENSHOT_DIR"

// screenshotPath returns where a test's screenshot named name goes.
func screenshotPath(t *testing.T, name string) string {
	t.Helper()
	dir := os.Getenv(screenshotDirEnv)
	if dir == "" {
		return filepath.Join(t.TempDir(), name)
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return filepath.Join(dir, name)
}

// textSummary is the summary the demo prints at its end, read back from
// the screen.
type textSummary struct {
	verdict string
	legs    []string
	// rows are the table's rows, header first, split into cells.
	rows [][]string
	// report is the report's path the summary names.
	report string
}

// cellSeparator splits the summary table's columns, two spaces or more
// apart (a cell holds single spaces: "1 warm-up", "0.4 ms").
var cellSeparator = regexp.MustCompile(`\s{2,}`)

// readSummary reads the summary at the end of a run's screen output: the
// VERDICT line, the leg lines under it, the table after the blank line,
// and the report line.
func readSummary(t *testing.T, out string) textSummary {
	t.Helper()
	lines := strings.Split(out, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "VERDICT: ") {
			start = i
		}
	}
	require.GreaterOrEqual(t, start, 0, "no VERDICT line:\n%s", out)
	s := textSummary{verdict: lines[start]}
	i := start + 1
	for ; i < len(lines) && lines[i] != ""; i++ {
		if l := strings.TrimSpace(lines[i]); strings.HasPrefix(lines[i], "  ") && !strings.HasPrefix(lines[i], "    ") &&
			!strings.HasPrefix(l, "first evidence") {
			s.legs = append(s.legs, l)
		}
	}
	for i++; i < len(lines) && lines[i] != ""; i++ {
		s.rows = append(s.rows, cellSeparator.Split(strings.TrimSpace(lines[i]), -1))
	}
	for ; i < len(lines); i++ {
		if rest, ok := strings.CutPrefix(lines[i], "report: "); ok {
			s.report, _, _ = strings.Cut(rest, " (open it in a browser)")
		}
	}
	return s
}

// TestReportInBrowser runs a short embedded demo, reads its summary from
// the screen, opens the HTML report it wrote in headless Chromium and
// checks that the report loads without a console message, fetches
// nothing, and shows the figures the summary printed: the verdict, each
// leg's line, every cell of the summary's table, and in each leg's charts
// the same per-phase figures (grants, moves, ResetAt changes, double
// grants, contradicting results, latency), as the charts' tooltips. A
// screenshot must show the charts' colours.
func TestReportInBrowser(t *testing.T) {
	browser := headless.RequireT(t)
	cfg := demoConfig(true)
	cfg.Embedded, cfg.Identifiers, cfg.Ramp, cfg.Progress = true, 60, []int{0, 50, 100}, 0
	cfg.CallTimeout = 2 * time.Second
	cfg.ReportPath = filepath.Join(t.TempDir(), "report.html")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := run(ctx, cfg, &out)
	require.NoError(t, err)
	require.True(t, v.Pass, out.String())
	screen := out.String()
	assert.NotContains(t, screen, "\n== mirror mode", "the full log stays off the screen without -v")
	sum := readSummary(t, screen)
	require.Equal(t, cfg.ReportPath, sum.report, screen)
	require.Len(t, sum.legs, 4, "mirror, split, and the notes of the rolling deploy and the stalled group: %q", sum.legs)
	require.Len(t, sum.rows, 1+2*(1+len(cfg.Ramp)), "header and one row per phase:\n%s", screen)
	assert.Equal(t, summaryHeader, sum.rows[0])

	assertReportShows(t, browser, sum, "migrate-demo-report.png")
}

// assertReportShows opens the report the summary names in headless
// Chromium and checks that it loads without a console message, fetches
// nothing, and shows the figures the summary printed: the verdict, each
// leg's line, every cell of the summary's table, and in each leg's charts
// the same per-phase figures (grants, moves, ResetAt changes, double
// grants, contradicting results, latency) as the charts' tooltips. A
// screenshot, named shotName, must show the charts' colours.
func assertReportShows(t *testing.T, browser *headless.Browser, sum textSummary, shotName string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	page, err := browser.Load(ctx, "file://"+sum.report, 1200, 900)
	require.NoError(t, err)
	assert.Empty(t, page.Console, "console messages")
	dom := page.DOM
	for _, external := range []string{"<script", "<link", " src=", "url(", "@import"} {
		assert.NotContains(t, dom, external, "the report is self-contained")
	}

	verdict, ok := headless.Element(dom, "p", "verdict")
	require.True(t, ok)
	assert.Equal(t, sum.verdict, headless.Text(verdict))
	legs, ok := headless.Element(dom, "ul", "legs")
	require.True(t, ok)
	for _, l := range sum.legs {
		assert.Contains(t, headless.Text(legs), l)
	}
	table, ok := headless.Element(dom, "table", "summary")
	require.True(t, ok)
	assert.Equal(t, sum.rows, headless.TableRows(table), "the report's table is the summary's")

	// Each phase's figures, from the summary's row, in the leg's charts.
	col := map[string]int{}
	for i, h := range sum.rows[0] {
		col[h] = i
	}
	legKeys := map[string]bool{}
	for _, row := range sum.rows[1:] {
		leg, phase := row[col["leg"]], row[col["phase"]]
		legKeys[leg] = true
		index, name, _ := strings.Cut(phase, " ")
		section, ok := headless.Element(dom, "section", "leg-"+leg)
		require.True(t, ok, "section of %s", leg)
		for _, fig := range []struct{ series, column string }{
			{"allowed", "allowed"}, {"denied", "denied"}, {"degraded", "degraded"}, {"moved", "moved"},
			{"ResetAt changes", "reset changes"}, {"double grants", "double grants"},
			{"contradicting results", "contradicting"},
		} {
			tip := fmt.Sprintf("<title>%s: %s in phase %s (%s)</title>", fig.series, row[col[fig.column]], index, name)
			assert.Contains(t, section, tip)
		}
		for _, q := range []string{"p50", "p99"} {
			assert.Contains(t, section, fmt.Sprintf("<title>%s %s in phase %s (%s)</title>", q, row[col[q]], index, name))
		}
	}
	for leg := range legKeys {
		for _, c := range []string{"share", "timeline", "grants", "invariants", "latency"} {
			assert.Contains(t, dom, `<svg id="`+leg+"-"+c+`"`)
		}
	}
	// The share chart's tooltips: group a of the new side decided some of
	// the last phase of the first mode (at 100 % or on the way down).
	assert.Regexp(t, `<title>(memory|redis)/a: \d+\.\d% of [\d,]+ decisions in phase \d+ \(\d+%\)</title>`, dom)

	shot := screenshotPath(t, shotName)
	require.NoError(t, browser.Screenshot(ctx, "file://"+sum.report, shot, 1200, 2600))
	t.Logf("screenshot of the report: %s", shot)
	banner := "#e8f5e9" // a pass
	if strings.HasPrefix(sum.verdict, "VERDICT: FAIL") {
		banner = "#ffebee"
	}
	colours := countColours(t, shot, storeColors["memcached"], storeColors["redis/a"], storeColors["redis/b"],
		colorAllowed, colorMoved, banner)
	for c, n := range colours {
		assert.Greater(t, n, 200, "pixels of %s in the screenshot", c)
	}
}

// countColours decodes a PNG and counts its pixels of each colour, given
// as "#rrggbb".
func countColours(t *testing.T, path string, hex ...string) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	want := map[color.RGBA]string{}
	counts := map[string]int{}
	for _, h := range hex {
		var c color.RGBA
		_, err := fmt.Sscanf(h, "#%02x%02x%02x", &c.R, &c.G, &c.B)
		require.NoError(t, err, h)
		c.A = 255
		want[c] = h
		counts[h] = 0
	}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			c := color.RGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(bl >> 8), A: uint8(a >> 8)}
			if h, ok := want[c]; ok {
				counts[h]++
			}
		}
	}
	return counts
}
