package headless

import (
	"html"
	"regexp"
	"strings"
)

// The DOM Chromium dumps is regular (every element closed, attributes
// quoted), so these helpers read it with patterns rather than a parser:
// tests only need the text of known elements.

var (
	tagPattern   = regexp.MustCompile(`(?s)<[^>]*>`)
	rowPattern   = regexp.MustCompile(`(?s)<tr[^>]*>(.*?)</tr>`)
	cellPattern  = regexp.MustCompile(`(?s)<t[dh][^>]*>(.*?)</t[dh]>`)
	spacePattern = regexp.MustCompile(`\s+`)
)

// Text returns the text of an HTML fragment: tags removed, entities
// decoded, white space (no-break spaces included) collapsed.
func Text(fragment string) string {
	text := html.UnescapeString(tagPattern.ReplaceAllString(fragment, " "))
	text = strings.ReplaceAll(text, "\u00a0", " ") // &nbsp;
	return strings.TrimSpace(spacePattern.ReplaceAllString(text, " "))
}

// Element returns the first element of dom whose id is id, tags included,
// and whether there is one. The element must not contain another of the
// same tag name.
func Element(dom, tag, id string) (string, bool) {
	re := regexp.MustCompile(`(?s)<` + regexp.QuoteMeta(tag) + `\b[^>]*\bid="` + regexp.QuoteMeta(id) + `"[^>]*>.*?</` +
		regexp.QuoteMeta(tag) + `>`)
	m := re.FindString(dom)
	return m, m != ""
}

// TableRows returns the text of each cell of each row of a table (an
// element from Element, or any fragment), header rows included.
func TableRows(table string) [][]string {
	var rows [][]string
	for _, r := range rowPattern.FindAllStringSubmatch(table, -1) {
		var cells []string
		for _, c := range cellPattern.FindAllStringSubmatch(r[1], -1) {
			cells = append(cells, Text(c[1]))
		}
		rows = append(rows, cells)
	}
	return rows
}
