package debugpage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/headless"
	"github.com/throttlekit/throttlekit/internal/testkit"
	debugpage "github.com/throttlekit/throttlekit/observe/debug"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// sectionRows returns the rows of the table under the page's heading h2,
// header row included, as a browser shows their text.
func sectionRows(t *testing.T, dom, h2 string) [][]string {
	t.Helper()
	_, rest, ok := strings.Cut(dom, "<h2>"+h2+"</h2>")
	require.True(t, ok, "no section %q", h2)
	rest, _, _ = strings.Cut(rest, "<h2>")
	return headless.TableRows(rest)
}

// TestPageInBrowser serves the debug page on loopback, after traffic
// through real throttlers, opens it in headless Chromium and checks that
// it loads without a console message, fetches nothing, and shows what its
// JSON form says: every backend with its health, every breaker, each
// rollout's split and counters, every limit, and the heaviest denied
// identifiers with their counts, an identifier holding markup shown as
// text. A screenshot shows the failing backend in red.
func TestPageInBrowser(t *testing.T) {
	browser := headless.RequireT(t)
	ctx := context.Background()
	clock, withClock := testkit.Clock()
	mem := memorybackend.New()
	// Open for an hour once two calls failed: every ping meets it open, so
	// that the JSON and the browser's load show the same health.
	guarded, err := breaker.Wrap(down{}, "192.0.2.9:6379", breaker.WithFailures(2), breaker.WithFailingFor(0), breaker.WithOpenFor(time.Hour),
		breaker.WithLogger(nil))
	require.NoError(t, err)
	src, err := rollout.NewStaticSource(30, rollout.WithStaticGroupID("sessions-2030"))
	require.NoError(t, err)
	ro, err := rollout.New(memorybackend.New(), memorybackend.New(), src, rollout.WithMode(rollout.MirrorMode))
	require.NoError(t, err)
	api := testkit.Policy(t, "api", "3/min, 100/h")
	search := testkit.Policy(t, "search", "10/s gcra burst=20")

	page, err := debugpage.New(
		debugpage.WithBackend("memory", mem),
		debugpage.WithBackend("cache", guarded),
		debugpage.WithRollout("sessions", ro),
		debugpage.WithPolicies(api, search),
		debugpage.WithClock(clock))
	require.NoError(t, err)
	obs := throttler.WithObserver(page.Observer())
	th := testkit.Throttler(t, mem, withClock, obs)
	failOpen := testkit.Throttler(t, guarded, withClock, obs, throttler.WithLogger(nil))
	routed := testkit.Throttler(t, ro, withClock, obs)
	for _, tr := range []struct {
		id string
		n  int
	}{{"abuser", 23}, {"pest", 13}, {"nuisance", 8}, {"alice", 3}, {"<b>x</b>", 5}} {
		allow(t, th, api, tr.id, tr.n)
	}
	allow(t, failOpen, api, "bob", 3) // opens the breaker
	for i := range 7 {
		allow(t, routed, api, fmt.Sprint("user-", i), 1)
	}

	srv := httptest.NewServer(page) // 127.0.0.1
	defer srv.Close()
	resp, body := get(t, srv, "/?format=json")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var want debugpage.Page
	require.NoError(t, json.Unmarshal([]byte(body), &want))

	loaded, err := browser.Load(ctx, srv.URL+"/", 1200, 900)
	require.NoError(t, err)
	assert.Empty(t, loaded.Console, "console messages")
	dom := loaded.DOM
	for _, external := range []string{"<script", "<link", " src=", "url(", "@import"} {
		assert.NotContains(t, dom, external, "the page is self-contained")
	}
	assert.Contains(t, headless.Text(dom), "Generated "+want.GeneratedAt.Format(time.RFC3339))

	backends := sectionRows(t, dom, "Backends")
	require.Len(t, backends, 1+len(want.Backends))
	assert.Equal(t, []string{"name", "kind", "health", "ping"}, backends[0])
	for i, b := range want.Backends {
		row := backends[1+i]
		require.Len(t, row, 4)
		health := "ok"
		if !b.Healthy {
			health = b.ErrorKind + ": " + b.Error
		}
		assert.Equal(t, []string{b.Name, b.Kind, health}, row[:3])
		// The ping is measured again by the browser's load.
		assert.Regexp(t, regexp.MustCompile(`^\d+\.\d\d ms$`), row[3])
	}
	assert.Equal(t, "breaker_open", want.Backends[1].ErrorKind, "the page shows a failing backend")

	breakers := sectionRows(t, dom, "Circuit breakers")
	require.Len(t, breakers, 1+len(want.Breakers))
	require.NotEmpty(t, want.Breakers)
	for i, b := range want.Breakers {
		// The browser's load pinged the backend once more, and the open
		// breaker rejected that ping too.
		assert.Equal(t, []string{b.Source, b.Server, b.State, strconv.FormatUint(b.Rejected+1, 10)}, breakers[1+i])
	}
	assert.Equal(t, "open", want.Breakers[0].State)

	rollouts := sectionRows(t, dom, "Rollouts")
	require.Len(t, rollouts, 1+len(want.Rollouts))
	r := want.Rollouts[0]
	row := rollouts[1]
	require.Len(t, row, 13)
	assert.Equal(t, []string{r.Name, r.Mode, r.Split, r.Source.Kind + ": ok", "n/a"}, row[:5])
	assert.Equal(t, strconv.FormatUint(r.Stats.Mirrored, 10), row[6])
	assert.EqualValues(t, 7, r.Stats.Mirrored)

	policies := sectionRows(t, dom, "Policies")
	var limits int
	for _, p := range want.Policies {
		for _, l := range p.Limits {
			limits++
			burst := ""
			if l.Burst > 0 {
				burst = strconv.FormatInt(l.Burst, 10)
			}
			assert.Contains(t, policies, []string{p.Name, l.Name, l.Spec, l.Algorithm, strconv.FormatInt(l.Max, 10), l.Window, burst})
		}
	}
	assert.Len(t, policies, 1+limits)

	heaviest := sectionRows(t, dom, "Heaviest denied identifiers")
	require.Len(t, heaviest, 1+len(want.TopDenied.Heaviest))
	require.NotEmpty(t, want.TopDenied.Heaviest)
	for i, d := range want.TopDenied.Heaviest {
		assert.Equal(t, []string{strconv.Itoa(i + 1), d.Policy, d.Identifier, strconv.FormatUint(d.Count, 10),
			strconv.FormatUint(d.Err, 10)}, heaviest[1+i])
	}
	assert.Contains(t, heaviest, []string{"4", "api", "<b>x</b>", "2", "0"}, "markup is shown as text")
	assert.NotContains(t, dom, "<b>x</b>", "and never parsed as markup")
	assert.Contains(t, headless.Text(dom), fmt.Sprintf("%d denials since", want.TopDenied.Denials))

	shot := filepath.Join(t.TempDir(), "debug-page.png")
	if dir := os.Getenv("THROTTLEKIT_SCREENSHOT_DIR"); dir != "" {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		shot = filepath.Join(dir, "debug-page.png")
	}
	require.NoError(t, browser.Screenshot(ctx, srv.URL+"/", shot, 1400, 1400))
	t.Logf("screenshot of the debug page: %s", shot)
	red, header := countPixels(t, shot)
	assert.Greater(t, red, 20, "the failing backend and the open breaker in red")
	assert.Greater(t, header, 1000, "table headers drawn")
}

// countPixels counts a screenshot's strongly red pixels (the page's
// class "bad", #b00) and those of its table headers' background (#f3f3f3).
func countPixels(t *testing.T, path string) (red, header int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			r, g, bl = r>>8, g>>8, bl>>8
			switch {
			case r > 150 && g < 60 && bl < 60:
				red++
			case r == 0xf3 && g == 0xf3 && bl == 0xf3:
				header++
			}
		}
	}
	return red, header
}
