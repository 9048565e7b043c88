package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// documentedSchemas reads the JSON documents doc.go's "# Output" section
// shows (go doc ./cmd/throttlekit), keyed by command: each is the block of
// indented lines after "// <command>:", with its // comments taken out and
// "{...}" read as an object the document shows elsewhere.
func documentedSchemas(t *testing.T) map[string]any {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	text := string(src)
	i := strings.Index(text, "// # Output")
	require.GreaterOrEqual(t, i, 0, "doc.go has no # Output section")
	lines := strings.Split(text[i:], "\n")
	heading := regexp.MustCompile(`^// ([a-z]+):$`)
	docs := map[string]any{}
	for n := 0; n < len(lines); n++ {
		sm := heading.FindStringSubmatch(lines[n])
		if sm == nil {
			continue
		}
		n++ // the blank comment line
		var block []string
		for n++; n < len(lines) && strings.HasPrefix(lines[n], "//\t"); n++ {
			block = append(block, withoutComment(strings.TrimPrefix(lines[n], "//\t")))
		}
		js := strings.ReplaceAll(strings.Join(block, "\n"), "{...}", "{}")
		js = regexp.MustCompile(`,(\s*[}\]])`).ReplaceAllString(js, "$1")
		var v any
		require.NoError(t, json.Unmarshal([]byte(js), &v), "doc.go's %s document is not JSON:\n%s", sm[1], js)
		docs[sm[1]] = v
	}
	return docs
}

// withoutComment cuts a trailing // comment outside JSON strings.
func withoutComment(line string) string {
	quoted := false
	for i := 0; i < len(line); i++ {
		switch {
		case quoted && line[i] == '\\':
			i++
		case line[i] == '"':
			quoted = !quoted
		case !quoted && strings.HasPrefix(line[i:], "//"):
			return strings.TrimRight(line[:i], " ")
		}
	}
	return line
}

// jsonPaths lists the field paths of a decoded document: "sides[].limits[].used".
// An empty object stands for one shown elsewhere and adds only its own path.
func jsonPaths(v any, prefix string, out map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			p := strings.TrimPrefix(prefix+"."+k, ".")
			out[p] = true
			jsonPaths(x, p, out)
		}
	case []any:
		for _, x := range v {
			jsonPaths(x, prefix+"[]", out)
		}
	}
}

// typePaths lists the field paths the encoder writes for type t. A map is
// data (its keys are not fields); wildcard holds the paths of objects the
// documentation abbreviates as {...}.
func typePaths(t reflect.Type, prefix string, out, maps map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		if t.Kind() == reflect.Slice {
			prefix += "[]"
		}
		t = t.Elem()
	}
	if t.Kind() == reflect.Map {
		maps[prefix] = true
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		p := strings.TrimPrefix(prefix+"."+name, ".")
		out[p] = true
		typePaths(f.Type, p, out, maps)
	}
}

// neverSet are the fields of a document type a command never fills: reset
// shares inspect's side type, whose limits only inspect reads.
var neverSet = map[string][]string{
	"reset": {"sides[].limits", "sides[].limits[].name", "sides[].limits[].algorithm", "sides[].limits[].window_ms",
		"sides[].limits[].limit", "sides[].limits[].used", "sides[].limits[].remaining", "sides[].limits[].reset_at",
		"sides[].limits[].reset_in_ms"},
}

// TestDocumentedOutputIsWhatIsPrinted: the JSON documents doc.go calls a
// stable interface list exactly the fields each command's document type
// encodes, no more and no fewer; and explain's, which needs no server, has
// the values explain prints for the policy and identifier it shows.
func TestDocumentedOutputIsWhatIsPrinted(t *testing.T) {
	docs := documentedSchemas(t)
	types := map[string]reflect.Type{
		"inspect": reflect.TypeOf(inspectDoc{}),
		"reset":   reflect.TypeOf(resetDoc{}),
		"cleanup": reflect.TypeOf(cleanupDoc{}),
		"explain": reflect.TypeOf(explainDoc{}),
	}
	require.Len(t, docs, len(types), "documents in doc.go: %v", keys(docs))
	for cmd, typ := range types {
		documented, encoded, maps := map[string]bool{}, map[string]bool{}, map[string]bool{}
		jsonPaths(docs[cmd], "", documented)
		typePaths(typ, "", encoded, maps)
		for p := range documented {
			for m := range maps {
				if strings.HasPrefix(p, m+".") {
					delete(documented, p) // a map's keys are data, not fields
				}
			}
		}
		for _, p := range neverSet[cmd] {
			delete(encoded, p)
		}
		// Objects abbreviated {...} (reset's policy) are shown in full in
		// another document.
		for p := range encoded {
			parent := p[:max(0, strings.LastIndex(p, "."))]
			if !documented[p] && documented[parent] && isEmptyObject(docs[cmd], parent) {
				documented[p] = true
			}
		}
		assert.Empty(t, diff(encoded, documented), "%s: fields printed but not documented in doc.go", cmd)
		assert.Empty(t, diff(documented, encoded), "%s: fields documented in doc.go but never printed", cmd)
	}

	// explain's example, value by value.
	want := docs["explain"].(map[string]any)
	policy := want["policy"].(map[string]any)["notation"].(string)
	code, out, errOut := runCLI(t, "explain", "--json", "--id", want["identifier"].(string), policy)
	require.Equal(t, exitOK, code, errOut)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	byName := map[string]any{}
	for _, l := range got["limits"].([]any) {
		byName[l.(map[string]any)["name"].(string)] = l
	}
	for _, l := range want["limits"].([]any) {
		name := l.(map[string]any)["name"].(string)
		require.Contains(t, byName, name, "explain prints no limit %q", name)
		sameValues(t, "limits["+name+"]", l, byName[name])
	}
	delete(want, "limits")
	sameValues(t, "explain", want, got)
}

// sameValues checks every value documented in want against got; a field
// got leaves out (omitempty, such as a group shown only with
// --redis-groups) is not compared.
func sameValues(t *testing.T, where string, want, got any) {
	t.Helper()
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !assert.True(t, ok, "%s: printed %v", where, got) {
			return
		}
		for k, v := range w {
			if x, present := g[k]; present {
				sameValues(t, where+"."+k, v, x)
			}
		}
	default:
		assert.Equal(t, fmt.Sprint(want), fmt.Sprint(got), "%s: doc.go shows %v, explain prints %v", where, want, got)
	}
}

func isEmptyObject(doc any, path string) bool {
	v := doc
	for _, part := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		v = m[strings.TrimSuffix(part, "[]")]
	}
	m, ok := v.(map[string]any)
	return ok && len(m) == 0
}

func diff(a, b map[string]bool) []string {
	var out []string
	for k := range a {
		if !b[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
