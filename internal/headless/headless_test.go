package headless_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/headless"
)

// TestLoadReportsConsoleErrors: a clean page loads with its DOM and no
// console message; a page whose script throws shows the uncaught error,
// so that a test checking for none has teeth.
func TestLoadReportsConsoleErrors(t *testing.T) {
	b := headless.RequireT(t)
	dir := t.TempDir()
	clean := filepath.Join(dir, "clean.html")
	broken := filepath.Join(dir, "broken.html")
	require.NoError(t, os.WriteFile(clean, []byte(`<!DOCTYPE html><html><head><title>t</title></head><body>
<table id="figures"><tr><th>name</th><th>count</th></tr><tr><td>moves</td><td>1,234</td></tr></table></body></html>`), 0o644))
	require.NoError(t, os.WriteFile(broken, []byte(`<!DOCTYPE html><html><body><p>x</p>
<script>console.error("boom"); notDefined();</script></body></html>`), 0o644))

	p, err := b.Load(context.Background(), "file://"+clean, 800, 600)
	require.NoError(t, err)
	assert.Empty(t, p.Console)
	table, ok := headless.Element(p.DOM, "table", "figures")
	require.True(t, ok, p.DOM)
	assert.Equal(t, [][]string{{"name", "count"}, {"moves", "1,234"}}, headless.TableRows(table))

	p, err = b.Load(context.Background(), "file://"+broken, 800, 600)
	require.NoError(t, err)
	require.Len(t, p.Console, 2, "%q", p.Console)
	assert.Contains(t, p.Console[0], "boom")
	assert.True(t, strings.Contains(p.Console[1], "Uncaught ReferenceError"), p.Console[1])
}

func TestText(t *testing.T) {
	assert.Equal(t, "a & b 12 ms", headless.Text("<p>a &amp; <b>b</b>\n 12&nbsp;ms</p>"))
}
