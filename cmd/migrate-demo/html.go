package main

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The report is one self-contained HTML file: inline CSS, inline SVG
// charts drawn here, no script and nothing fetched, so that it opens from
// disk on a machine without network and shows the same in any browser.

// chart is an SVG chart: its geometry is computed in Go, the template only
// writes the elements out.
type chart struct {
	// ID names the chart in the page ("mirror-share").
	ID            string
	Title         string
	Width, Height float64
	Rects         []svgRect
	Lines         []svgLine
	Polylines     []svgPolyline
	Texts         []svgText
	Legend        []legendItem
}

// svgRect is a bar or a bar's segment; Tip is its tooltip (an SVG title).
type svgRect struct {
	X, Y, W, H float64
	Fill, Tip  string
}

type svgLine struct {
	X1, Y1, X2, Y2 float64
	Stroke         string
	Dashed         bool
}

type svgPolyline struct {
	Points, Stroke string
}

type svgText struct {
	X, Y   float64
	Anchor string // start, middle, end
	Class  string // "small", "value", "bad"
	Text   string
}

// legendItem is a colour and its label, at X along the chart's foot.
type legendItem struct {
	Fill, Label string
	X           float64
}

// placeLegend puts the legend's items one after another, each as wide as
// its label.
func placeLegend(c *chart) {
	x := float64(plotLeft)
	for i := range c.Legend {
		c.Legend[i].X = x
		x += 28 + 7.5*float64(len([]rune(c.Legend[i].Label)))
	}
}

// storeColors gives each store a colour the charts share: the old side in
// warm colours, the new side's groups in blues.
var storeColors = map[string]string{
	legacyStore:    "#8c564b",
	deployingStore: "#c49c94",
	"memcached":    "#ff7f0e",
	"memory":       "#ff7f0e",
	"redis/a":      "#1f77b4",
	"redis/b":      "#6baed6",
	"memory/a":     "#1f77b4",
	"memory/b":     "#6baed6",
}

const (
	colorAllowed   = "#2ca02c"
	colorDenied    = "#9e9e9e"
	colorDegraded  = "#d62728"
	colorMoved     = "#9467bd"
	colorChecked   = "#c5b0d5"
	colorBroken    = "#d62728"
	colorP50       = "#1f77b4"
	colorP99       = "#ff7f0e"
	colorOtherSide = "#bdbdbd"
	// colorContradicting marks results that contradict the store.
	colorContradicting = "#e377c2"
)

func storeColor(store string) string {
	if c, ok := storeColors[store]; ok {
		return c
	}
	return colorOtherSide
}

// Chart geometry, in SVG units (pixels at 100 %).
const (
	chartWidth  = 880
	chartHeight = 270
	plotLeft    = 60
	plotRight   = 20
	plotTop     = 30
	plotBottom  = 50
)

// plot is the drawing area of a chart and its y scale.
type plot struct {
	c        *chart
	x0, y0   float64 // top left of the plot area
	w, h     float64
	yMax     float64
	yUnit    string
	barSlots int
}

func newPlot(id, title string, slots int, yMax float64, yUnit string) *plot {
	c := &chart{ID: id, Title: title, Width: chartWidth, Height: chartHeight}
	p := &plot{c: c, x0: plotLeft, y0: plotTop, w: chartWidth - plotLeft - plotRight,
		h: chartHeight - plotTop - plotBottom, yMax: niceCeil(yMax), yUnit: yUnit, barSlots: max(slots, 1)}
	c.Texts = append(c.Texts, svgText{X: 8, Y: 18, Anchor: "start", Class: "title", Text: title})
	// Four grid lines with their values.
	for i := 0; i <= 4; i++ {
		v := p.yMax * float64(i) / 4
		y := p.y(v)
		c.Lines = append(c.Lines, svgLine{X1: p.x0, Y1: y, X2: p.x0 + p.w, Y2: y, Stroke: "#e0e0e0"})
		c.Texts = append(c.Texts, svgText{X: p.x0 - 6, Y: y + 4, Anchor: "end", Class: "small", Text: axisLabel(v, yUnit)})
	}
	return p
}

// y maps a value to its height on the chart.
func (p *plot) y(v float64) float64 {
	if p.yMax <= 0 {
		return p.y0 + p.h
	}
	return p.y0 + p.h - p.h*math.Min(v, p.yMax)/p.yMax
}

// slot returns the left edge and width of slot i of the x axis.
func (p *plot) slot(i int) (x, w float64) {
	w = p.w / float64(p.barSlots)
	return p.x0 + w*float64(i), w
}

// xLabel writes a label under slot i.
func (p *plot) xLabel(i int, text string) {
	x, w := p.slot(i)
	p.c.Texts = append(p.c.Texts, svgText{X: x + w/2, Y: p.y0 + p.h + 16, Anchor: "middle", Class: "small", Text: text})
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, and at least 1.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	pow := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*pow {
			return m * pow
		}
	}
	return 10 * pow
}

func axisLabel(v float64, unit string) string {
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if v >= 1000 && unit == "" {
		s = fmtInt(int64(v))
	}
	if v != math.Trunc(v) {
		s = strconv.FormatFloat(v, 'f', 1, 64)
	}
	return s + unit
}

// phaseName is a phase's short name under its column: "warm-up", "10%",
// "stalls".
func phaseName(leg legRecord, p phaseResult) string {
	switch {
	case p.name != "":
		return p.name
	case p.warmUp:
		return "warm-up"
	case leg.key == "stall":
		return fmt.Sprintf("%d stalls", p.stalls)
	}
	return strconv.Itoa(p.target) + "%"
}

// legStores returns the stores that decided any of the leg's requests,
// old side first (the legacy limiter before memcached), then the new
// side's groups by name.
func legStores(leg legRecord) []string {
	seen := map[string]bool{}
	for _, p := range leg.phases {
		for s := range p.totals.decisions {
			seen[s] = true
		}
	}
	stores := make([]string, 0, len(seen))
	for s := range seen {
		stores = append(stores, s)
	}
	rank := func(s string) int {
		switch {
		case storeKind(s) == legacyStore:
			return 0
		case !strings.Contains(s, "/"):
			return 1
		}
		return 2
	}
	sort.Slice(stores, func(i, j int) bool {
		if rank(stores[i]) != rank(stores[j]) {
			return rank(stores[i]) < rank(stores[j])
		}
		return stores[i] < stores[j]
	})
	return stores
}

// shareTip is the tooltip of a store's share of a phase's decisions; the
// report's test looks for it.
func shareTip(store string, phase int, name string, n, total int64) string {
	return fmt.Sprintf("%s: %s of %s decisions in phase %d (%s)", store, percentOf(n, total), fmtInt(total), phase, name)
}

func percentOf(n, total int64) string {
	if total == 0 {
		return "0%"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(total))
}

// shareChart stacks, per phase, each store's share of the decisions.
func shareChart(leg legRecord) chart {
	stores := legStores(leg)
	p := newPlot(leg.key+"-share", "Share of decisions per store, per phase", len(leg.phases), 100, "%")
	for i, ph := range leg.phases {
		var total int64
		for _, n := range ph.totals.decisions {
			total += n
		}
		x, w := p.slot(i)
		bottom := 0.0
		for _, s := range stores {
			n := ph.totals.decisions[s]
			if n == 0 || total == 0 {
				continue
			}
			share := 100 * float64(n) / float64(total)
			yTop, yBottom := p.y(bottom+share), p.y(bottom)
			p.c.Rects = append(p.c.Rects, svgRect{X: x + w*0.15, Y: yTop, W: w * 0.7, H: yBottom - yTop,
				Fill: storeColor(s), Tip: shareTip(s, ph.index+1, phaseName(leg, ph), n, total)})
			if yBottom-yTop >= 14 {
				p.c.Texts = append(p.c.Texts, svgText{X: x + w/2, Y: (yTop+yBottom)/2 + 4, Anchor: "middle", Class: "inbar",
					Text: fmt.Sprintf("%.0f%%", share)})
			}
			bottom += share
		}
		p.xLabel(i, phaseName(leg, ph))
	}
	for _, s := range stores {
		p.c.Legend = append(p.c.Legend, legendItem{Fill: storeColor(s), Label: s})
	}
	return *p.c
}

// series is one bar of a grouped bar chart: a name, a colour and the
// value per phase.
type series struct {
	name, color string
	value       func(phaseResult) int64
	bad         bool // a non-zero value breaks an invariant
}

// groupedChart draws, per phase, one bar per series with its value above.
func groupedChart(leg legRecord, id, title string, all []series) chart {
	var top float64
	for _, ph := range leg.phases {
		for _, s := range all {
			top = math.Max(top, float64(s.value(ph)))
		}
	}
	p := newPlot(leg.key+"-"+id, title, len(leg.phases), top*1.15, "")
	for i, ph := range leg.phases {
		x, w := p.slot(i)
		bw := w * 0.8 / float64(len(all))
		for j, s := range all {
			v := s.value(ph)
			bx := x + w*0.1 + bw*float64(j)
			yTop := p.y(float64(v))
			p.c.Rects = append(p.c.Rects, svgRect{X: bx, Y: yTop, W: bw * 0.9, H: p.y0 + p.h - yTop, Fill: s.color,
				Tip: fmt.Sprintf("%s: %s in phase %d (%s)", s.name, fmtInt(v), ph.index+1, phaseName(leg, ph))})
			class := "value"
			if s.bad && v > 0 {
				class = "bad"
			}
			p.c.Texts = append(p.c.Texts, svgText{X: bx + bw*0.45, Y: yTop - 3, Anchor: "middle", Class: class,
				Text: compact(v)})
		}
		p.xLabel(i, phaseName(leg, ph))
	}
	for _, s := range all {
		p.c.Legend = append(p.c.Legend, legendItem{Fill: s.color, Label: s.name})
	}
	return *p.c
}

// compact writes n short enough to sit above a thin bar: 950, 12.3k.
func compact(n int64) string {
	if n < 10_000 {
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("%.1fk", float64(n)/1000)
}

// grantsChart: allowed, denied and degraded responses per phase.
func grantsChart(leg legRecord) chart {
	return groupedChart(leg, "grants", "Grants per phase: allowed, denied and degraded responses", []series{
		{name: "allowed", color: colorAllowed, value: func(p phaseResult) int64 { return p.totals.all().allowed }},
		{name: "denied", color: colorDenied, value: func(p phaseResult) int64 { return p.totals.all().denied }},
		{name: "degraded", color: colorDegraded, value: func(p phaseResult) int64 { return p.totals.all().degraded }},
	})
}

// invariantsChart: moves, and what must stay 0, per phase.
func invariantsChart(leg legRecord) chart {
	return groupedChart(leg, "invariants", "Moves, ResetAt changes, double grants and contradicting results per phase", []series{
		{name: "moved", color: colorMoved, value: func(p phaseResult) int64 { return p.totals.all().moved }},
		{name: "moves checked in an open window", color: colorChecked, value: func(p phaseResult) int64 { return p.totals.all().checked }},
		{name: "ResetAt changes", color: colorBroken, bad: true, value: func(p phaseResult) int64 { return p.totals.all().resetChanges }},
		{name: "double grants", color: "#8b0000", bad: true, value: func(p phaseResult) int64 { return p.totals.all().doubleGrants }},
		{name: "contradicting results", color: colorContradicting, bad: true, value: func(p phaseResult) int64 { return p.totals.all().contradictions }},
	})
}

// latencyChart: the p50 and p99 of the responses' latency per phase.
func latencyChart(leg legRecord) chart {
	var top float64
	for _, ph := range leg.phases {
		top = math.Max(top, millis(ph.p99))
	}
	p := newPlot(leg.key+"-latency", "Latency per phase: p50 and p99 of the time a client waited, in ms",
		len(leg.phases), top*1.15, " ms")
	for _, q := range []struct {
		name, color string
		value       func(phaseResult) time.Duration
	}{{"p50", colorP50, func(ph phaseResult) time.Duration { return ph.p50 }},
		{"p99", colorP99, func(ph phaseResult) time.Duration { return ph.p99 }}} {
		var points []string
		for i, ph := range leg.phases {
			x, w := p.slot(i)
			cx, cy := x+w/2, p.y(millis(q.value(ph)))
			points = append(points, fmt.Sprintf("%.1f,%.1f", cx, cy))
			p.c.Rects = append(p.c.Rects, svgRect{X: cx - 3, Y: cy - 3, W: 6, H: 6, Fill: q.color,
				Tip: fmt.Sprintf("%s %s in phase %d (%s)", q.name, fmtMillis(q.value(ph)), ph.index+1, phaseName(leg, ph))})
			p.c.Texts = append(p.c.Texts, svgText{X: cx + 6, Y: cy - 6, Anchor: "start", Class: "value",
				Text: fmtMillis(q.value(ph))})
		}
		p.c.Polylines = append(p.c.Polylines, svgPolyline{Points: strings.Join(points, " "), Stroke: q.color})
		p.c.Legend = append(p.c.Legend, legendItem{Fill: q.color, Label: q.name})
	}
	for i, ph := range leg.phases {
		p.xLabel(i, phaseName(leg, ph))
	}
	return *p.c
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// timelineChart stacks, per second of the leg, the responses of each
// store, with the degraded ones as a red line, and marks where each phase
// began.
func timelineChart(leg legRecord) chart {
	stores := legStores(leg)
	var top float64
	for _, b := range leg.timeline {
		var n int64
		for _, v := range b.stores {
			n += v
		}
		top = math.Max(top, float64(n+b.errors))
	}
	p := newPlot(leg.key+"-timeline", "Over time: responses per second by deciding store; degraded in red, "+
		"contradicting results in pink", len(leg.timeline), top*1.1, "")
	var degraded, contradicting []string
	for i, b := range leg.timeline {
		x, w := p.slot(i)
		bottom := 0.0
		for _, s := range stores {
			n := float64(b.stores[s])
			if n == 0 {
				continue
			}
			yTop, yBottom := p.y(bottom+n), p.y(bottom)
			p.c.Rects = append(p.c.Rects, svgRect{X: x, Y: yTop, W: math.Max(w-0.5, 0.5), H: yBottom - yTop,
				Fill: storeColor(s), Tip: fmt.Sprintf("second %d: %s %s responses", i, fmtInt(int64(n)), s)})
			bottom += n
		}
		degraded = append(degraded, fmt.Sprintf("%.1f,%.1f", x+w/2, p.y(float64(b.degraded))))
		contradicting = append(contradicting, fmt.Sprintf("%.1f,%.1f", x+w/2, p.y(float64(b.contradictions))))
		if b.contradictions > 0 {
			// Too few to read off the scale of responses: written out
			// above the second's bar.
			p.c.Texts = append(p.c.Texts, svgText{X: x + w/2, Y: p.y(bottom) - 4, Anchor: "middle", Class: "bad",
				Text: "×" + strconv.FormatInt(b.contradictions, 10)})
		}
		if i%5 == 0 {
			p.xLabel(i, fmt.Sprintf("%ds", i))
		}
	}
	if len(degraded) > 0 {
		p.c.Polylines = append(p.c.Polylines, svgPolyline{Points: strings.Join(degraded, " "), Stroke: colorDegraded},
			svgPolyline{Points: strings.Join(contradicting, " "), Stroke: colorContradicting})
	}
	for _, ph := range leg.phases {
		sec := ph.start.Seconds()
		if len(leg.timeline) == 0 {
			break
		}
		x := p.x0 + p.w*sec/float64(len(leg.timeline))
		p.c.Lines = append(p.c.Lines, svgLine{X1: x, Y1: p.y0, X2: x, Y2: p.y0 + p.h, Stroke: "#333", Dashed: true})
		p.c.Texts = append(p.c.Texts, svgText{X: x + 3, Y: p.y0 + 10, Anchor: "start", Class: "small",
			Text: phaseName(leg, ph)})
	}
	for _, s := range stores {
		p.c.Legend = append(p.c.Legend, legendItem{Fill: storeColor(s), Label: s})
	}
	p.c.Legend = append(p.c.Legend, legendItem{Fill: colorDegraded, Label: "degraded"},
		legendItem{Fill: colorContradicting, Label: "contradicting"})
	return *p.c
}

// reportView is what the template shows.
type reportView struct {
	Verdict   string
	Pass      bool
	Generated string
	RunTime   string
	Journey   string
	Policy    string
	Command   string
	LegLines  []legView
	Notes     []string
	Header    []string
	Rows      [][]string
	Log       string
	LogPath   string
}

// legView is one leg's section.
type legView struct {
	Key, Name, Line, Note string
	Pass                  bool
	Charts                []chart
	Evidence              []string
}

// renderReport writes the run's HTML report.
func renderReport(r *runRecord) ([]byte, error) {
	v := reportView{
		Verdict:   r.verdict.Line,
		Pass:      r.verdict.Pass,
		Generated: r.started.Format("2006-01-02 15:04:05 MST"),
		RunTime:   fmt.Sprintf("%.1f s", r.took.Seconds()),
		Journey:   r.journey,
		Policy:    r.policy,
		Notes:     r.notes,
		Header:    summaryHeader,
		Rows:      summaryRows(r),
		Log:       r.log.String(),
		LogPath:   r.logPath,
	}
	for _, leg := range r.legs {
		lv := legView{Key: leg.key, Name: leg.name, Line: legLine(leg), Note: leg.note, Pass: leg.verdict.Pass,
			Evidence: leg.evidence}
		if !leg.verdict.Pass {
			lv.Line = leg.verdict.Line
		}
		lv.Charts = []chart{shareChart(leg), timelineChart(leg), grantsChart(leg), invariantsChart(leg), latencyChart(leg)}
		for i := range lv.Charts {
			placeLegend(&lv.Charts[i])
		}
		v.LegLines = append(v.LegLines, lv)
	}
	var b bytes.Buffer
	if err := reportTemplate.Execute(&b, v); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	return b.Bytes(), nil
}

var reportTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"f": func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>throttlekit migrate-demo report</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1180px;color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.verdict{font-size:1.05em;padding:.7em 1em;border-radius:6px;font-weight:600}
.pass{background:#e8f5e9;border:1px solid #66bb6a}.fail{background:#ffebee;border:1px solid #e57373}
.meta{color:#555}table{border-collapse:collapse;font-size:.8em;margin:.8em 0}
td,th{border:1px solid #ddd;padding:.2em .5em;text-align:right;white-space:nowrap}
th{background:#f5f5f5}td:first-child,td:nth-child(2),th:first-child,th:nth-child(2){text-align:left}
svg{display:block;margin:.6em 0;background:#fff;border:1px solid #eee}
svg .title{font-size:13px;font-weight:600;fill:#333}svg .small{font-size:10px;fill:#555}
svg .value{font-size:9px;fill:#333}svg .bad{font-size:10px;fill:#d62728;font-weight:700}
svg .inbar{font-size:10px;fill:#fff}svg .legend{font-size:11px;fill:#333}
pre{font-size:.75em;background:#fafafa;border:1px solid #eee;padding:.8em;overflow-x:auto}
li.bad{color:#b71c1c}
</style></head>
<body>
<h1>throttlekit migrate-demo</h1>
<p class="meta">Moving live rate-limit windows from {{.Journey}} · policy <code>{{.Policy}}</code> · run started {{.Generated}}, took {{.RunTime}}</p>
<p id="verdict" class="verdict {{if .Pass}}pass{{else}}fail{{end}}">{{.Verdict}}</p>
<ul id="legs">{{range .LegLines}}<li{{if not .Pass}} class="bad"{{end}}>{{.Line}}</li>{{end}}{{range .Notes}}<li>{{.}}</li>{{end}}</ul>

<h2>Summary</h2>
<table id="summary"><thead><tr>{{range .Header}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</tbody></table>
<p class="meta">A move is a response decided by another store than the client's previous one; reset changes, double grants
and contradicting results are judged from the headers clients read (X-RateLimit-Reset, X-RateLimit-Used and the demo's
X-Demo-* headers) and must all be 0; degraded responses are marked by the middleware.</p>

{{range .LegLines}}<section id="leg-{{.Key}}">
<h2>{{.Name}}</h2>
{{if .Note}}<p class="meta">{{.Note}}</p>{{end}}
{{range .Charts}}{{$c := .}}<svg id="{{.ID}}" xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="{{.Title}}">
{{range .Lines}}<line x1="{{f .X1}}" y1="{{f .Y1}}" x2="{{f .X2}}" y2="{{f .Y2}}" stroke="{{.Stroke}}"{{if .Dashed}} stroke-dasharray="4 3"{{end}}/>
{{end}}{{range .Rects}}<rect x="{{f .X}}" y="{{f .Y}}" width="{{f .W}}" height="{{f .H}}" fill="{{.Fill}}"><title>{{.Tip}}</title></rect>
{{end}}{{range .Polylines}}<polyline points="{{.Points}}" fill="none" stroke="{{.Stroke}}" stroke-width="2"/>
{{end}}{{range .Texts}}<text x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}" class="{{.Class}}">{{.Text}}</text>
{{end}}{{range .Legend}}<rect x="{{f .X}}" y="{{f $c.Height}}" transform="translate(0,-16)" width="10" height="10" fill="{{.Fill}}"/><text x="{{f .X}}" dx="14" y="{{f $c.Height}}" dy="-7" class="legend">{{.Label}}</text>
{{end}}</svg>
{{end}}{{if .Evidence}}<h3>Broken invariants (first examples)</h3><ul>{{range .Evidence}}<li class="bad">{{.}}</li>{{end}}</ul>{{end}}
</section>
{{end}}
<h2>Full log</h2>
<details><summary>What <code>-v</code> prints{{if .LogPath}} (also in {{.LogPath}}){{end}}</summary><pre>{{.Log}}</pre></details>
</body></html>
`))
