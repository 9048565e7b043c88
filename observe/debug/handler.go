package debugpage

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/observe"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Handler is the debug page: an http.Handler to mount on an internal
// port, and the Observer that feeds its heaviest denied identifiers. It is
// safe for concurrent use.
type Handler struct {
	cfg     config
	denied  *sketch
	obs     deniedObserver
	started time.Time
	since   atomic.Int64 // unix ns the sketch started counting at
}

// New returns a Handler configured by opts. A bad option is an error
// wrapping throttler.ErrInvalidOption.
func New(opts ...Option) (*Handler, error) {
	c := config{k: DefaultTopK, pingTimeout: DefaultPingTimeout, clock: wallClock{}}
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil Option")
		}
		if err := o.apply(&c); err != nil {
			return nil, err
		}
	}
	for name, f := range c.statuses {
		found := false
		for i := range c.rollouts {
			if c.rollouts[i].name == name {
				c.rollouts[i].status, found = f, true
			}
		}
		if !found {
			return nil, invalid("WithSourceStatus(%q): no rollout of that name (WithRollout)", name)
		}
	}
	h := &Handler{cfg: c, denied: newSketch(c.k)}
	h.obs = deniedObserver{h.denied}
	h.started = c.clock.Now()
	h.since.Store(h.started.UnixNano())
	return h, nil
}

// wallClock reads time.Now.
type wallClock struct{}

// Now returns time.Now().
func (wallClock) Now() time.Time { return time.Now() }

// Observer returns the throttler.Observer that feeds the page's heaviest
// denied identifiers: give it to throttler.WithObserver of every throttler
// whose denials the page should count. It counts, by policy and
// identifier, the denials of allow decisions and the refused acquires of
// concurrency limits: those of the store, of the deny cache and of
// FailLocal. It does not count degraded denials (a backend failing closed
// denies everyone, which says nothing of the identifier). An allowed
// decision costs it a field test; a denial, a hash and a short critical
// section in one of the sketch's shards.
func (h *Handler) Observer() throttler.Observer {
	if h == nil || h.obs.s == nil {
		return throttler.ObserverFunc(func(context.Context, throttler.Event) {})
	}
	return h.obs
}

// deniedObserver feeds a sketch.
type deniedObserver struct{ s *sketch }

// Observe implements throttler.Observer.
func (o deniedObserver) Observe(_ context.Context, e throttler.Event) {
	if e.Result.Allowed || !e.HasResult() || (e.Op != "allow" && e.Op != "acquire") {
		return
	}
	var kind int
	switch observe.Outcome(&e.Result) {
	case observe.Denied:
		kind = kindDenied
	case observe.Cached:
		kind = kindCached
	case observe.LocalDenied:
		kind = kindLocal
	default:
		return
	}
	o.s.add(e.Policy, e.Identifier, kind)
}

// ResetDenied empties the sketch of the heaviest denied identifiers: the
// page counts afresh from now.
func (h *Handler) ResetDenied() {
	if h == nil || h.denied == nil {
		return
	}
	h.denied.reset()
	h.since.Store(h.cfg.clock.Now().UnixNano())
}

// Snapshot gathers the page. It pings every backend and every rollout's
// flag source that implements driver.Pinger, concurrently, each within
// the ping timeout, then reads the breakers, rollouts, policies and the
// sketch. It returns within about the ping timeout even when a ping
// ignores its context. A Handler not made by New gives an empty page.
func (h *Handler) Snapshot(ctx context.Context) Page {
	if h == nil || h.denied == nil {
		return Page{Backends: []Backend{}, Breakers: []Breaker{}, Rollouts: []Rollout{}, Policies: []Policy{},
			TopDenied: TopDenied{ByOutcome: map[string]uint64{}, Heaviest: []Denied{}}}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	now := h.cfg.clock.Now()
	p := Page{
		GeneratedAt: now.UTC(),
		Uptime:      now.Sub(h.started).Round(time.Second).String(),
		Backends:    make([]Backend, len(h.cfg.backends)),
		Breakers:    []Breaker{},
		Rollouts:    make([]Rollout, len(h.cfg.rollouts)),
		Policies:    make([]Policy, 0, len(h.cfg.policies)),
	}
	var wg sync.WaitGroup
	for i, nb := range h.cfg.backends {
		b := &p.Backends[i]
		*b = Backend{Name: nb.name, Kind: fmt.Sprintf("%T", nb.b), Healthy: true}
		if pg, ok := nb.b.(driver.Pinger); ok {
			wg.Add(1)
			go func() {
				defer wg.Done()
				took, err := h.ping(ctx, pg)
				b.Pinged, b.PingMs = true, milliseconds(took)
				if err != nil {
					b.Healthy, b.Error, b.ErrorKind = false, err.Error(), observe.ErrorKind(err)
				}
			}()
		}
	}
	for i, nr := range h.cfg.rollouts {
		r := &p.Rollouts[i]
		*r = rolloutOf(nr, now)
		if pg, ok := nr.b.Source().(driver.Pinger); ok {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := h.ping(ctx, pg)
				r.Source.Pinged = true
				if err != nil {
					r.Source.Healthy, r.Source.Error = false, err.Error()
				}
			}()
		}
	}
	for _, pol := range h.cfg.policies {
		p.Policies = append(p.Policies, policyOf(pol))
	}
	p.TopDenied = h.topDenied()
	wg.Wait()
	// The breakers are read after the pings, which went through them.
	for _, nb := range h.cfg.backends {
		switch r := nb.b.(type) {
		case interface{ Breakers() []breaker.Status }:
			p.Breakers = appendBreakers(p.Breakers, nb.name, r.Breakers)
		case interface{ Breaker() *breaker.Breaker }:
			p.Breakers = appendBreakers(p.Breakers, nb.name, func() []breaker.Status {
				if br := r.Breaker(); br != nil {
					return []breaker.Status{br.Status()}
				}
				return nil
			})
		}
	}
	for _, nb := range h.cfg.breakers {
		p.Breakers = appendBreakers(p.Breakers, nb.name, nb.statuses)
	}
	return p
}

// ping pings pg within the ping timeout and returns how long it took. A
// ping that panics, or does not return by the deadline, is an error; one
// that ignores its context is left to finish on its own.
func (h *Handler) ping(ctx context.Context, pg driver.Pinger) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.pingTimeout)
	defer cancel()
	type answer struct {
		took time.Duration
		err  error
	}
	done := make(chan answer, 1)
	start := time.Now()
	go func() {
		defer func() {
			if v := recover(); v != nil {
				done <- answer{time.Since(start), fmt.Errorf("throttlekit: debugpage: ping panicked: %v", v)}
			}
		}()
		err := pg.Ping(ctx)
		done <- answer{time.Since(start), err}
	}()
	select {
	case a := <-done:
		return a.took, a.err
	case <-ctx.Done():
		return time.Since(start), fmt.Errorf("throttlekit: debugpage: no answer to ping within %v: %w", h.cfg.pingTimeout, ctx.Err())
	}
}

func milliseconds(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// appendBreakers appends the breakers statuses reports. A report that
// panics (a breaker.Backend not built by breaker.Wrap) is one breaker of
// state "unknown".
func appendBreakers(out []Breaker, source string, statuses func() []breaker.Status) (res []Breaker) {
	defer func() {
		if v := recover(); v != nil {
			res = append(out, Breaker{Source: source, Server: fmt.Sprintf("(no report: %v)", v), State: "unknown"})
		}
	}()
	for _, s := range statuses() {
		out = append(out, Breaker{Source: source, Server: s.Server, State: s.State.String(), Rejected: s.Rejected})
	}
	return out
}

// rolloutOf reads a rollout's split, source freshness and counters.
func rolloutOf(nr namedRollout, now time.Time) Rollout {
	src := nr.b.Source()
	st := nr.b.Stats()
	r := Rollout{Name: nr.name, Mode: nr.b.Mode().String(), Split: "none yet",
		Source: Source{Kind: fmt.Sprintf("%T", src), Healthy: true},
		Stats: RolloutStats{
			DefaultRouted: st.DefaultRouted, Mirrored: st.Mirrored,
			MirrorShortfalls: st.MirrorShortfalls, MirrorShortfallUnits: st.MirrorShortfallUnits,
			MirrorDiverged: st.MirrorDiverged, SeedChecks: st.SeedChecks, Seeded: st.Seeded,
			SecondaryErrors: st.SecondaryErrors, ShadowCompared: st.ShadowCompared, ShadowMismatches: st.ShadowMismatches,
			MismatchesByKind: Mismatches{AllowedDenied: st.AllowedDenied, DeniedAllowed: st.DeniedAllowed,
				RemainingDiffers: st.RemainingDiffers, ResetDiffers: st.ResetDiffers},
		}}
	if src != nil {
		if sp := src.Split(); sp != nil {
			r.HasSplit, r.Split = true, sp.String()
			r.PercentNew, r.Killed, r.GroupID = sp.Percent(), sp.Killed(), sp.GroupID()
		}
	}
	var ss SourceStatus
	if f, ok := src.(interface{ LastFetch() time.Time }); ok {
		ss.LastFetch = f.LastFetch()
	}
	if nr.status != nil {
		given := nr.status()
		if given.LastFetch.IsZero() {
			given.LastFetch = ss.LastFetch
		}
		ss = given
	}
	if !ss.LastFetch.IsZero() {
		t := ss.LastFetch.UTC()
		age := now.Sub(t).Seconds()
		r.Source.LastFetch, r.Source.FetchAgeSeconds = &t, &age
	}
	if !ss.LastUpdate.IsZero() {
		t := ss.LastUpdate.UTC()
		r.Source.LastUpdate = &t
	}
	r.Source.Errors = ss.Errors
	if ss.LastError != nil {
		r.Source.LastError = ss.LastError.Error()
	}
	return r
}

func policyOf(p *throttler.Policy) Policy {
	out := Policy{Name: p.Name(), Spec: p.String(), Limits: []Limit{}}
	for _, l := range p.Limits() {
		name := l.Name
		if name == "" {
			name = l.String()
		}
		out.Limits = append(out.Limits, Limit{Name: name, Spec: l.String(), Algorithm: l.Algorithm.String(),
			Max: l.Max, Window: l.Window.String(), Burst: l.Burst})
	}
	return out
}

func (h *Handler) topDenied() TopDenied {
	top, tot := h.denied.top()
	t := TopDenied{
		K:     h.cfg.k,
		Since: time.Unix(0, h.since.Load()).UTC(),
		ByOutcome: map[string]uint64{
			observe.Denied: tot.kinds[kindDenied], observe.Cached: tot.kinds[kindCached],
			observe.LocalDenied: tot.kinds[kindLocal],
		},
		Denials:  tot.seen,
		Tracked:  tot.tracked,
		Heaviest: make([]Denied, len(top)),
	}
	for i, e := range top {
		t.Heaviest[i] = Denied{Policy: e.Key.policy, Identifier: e.Key.id, Count: e.Count, Err: e.Err}
	}
	return t
}

// ServeHTTP serves the page: HTML, or JSON with ?format=json (the Page
// type is its schema). It answers GET and HEAD only, and asks that the
// page not be cached.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	format := r.URL.Query().Get("format")
	if format != "" && format != "html" && format != "json" {
		http.Error(w, "unknown format: want html or json", http.StatusBadRequest)
		return
	}
	page := h.Snapshot(r.Context())
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if format == "json" {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(page)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = pageTemplate.Execute(w, page)
}

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"inc": func(i int) int { return i + 1 },
	"ms":  func(f float64) string { return fmt.Sprintf("%.2f ms", f) },
	"age": func(f *float64) string {
		return (time.Duration(*f * float64(time.Second))).Round(100 * time.Millisecond).String()
	},
}).Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>throttlekit debug</title>
<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}th{background:#f3f3f3}
.bad{color:#b00;font-weight:bold}.num{text-align:right}</style></head>
<body><h1>throttlekit</h1>
<p>Generated {{.GeneratedAt.Format "2006-01-02T15:04:05Z07:00"}}, up {{.Uptime}}. <a href="?format=json">JSON</a></p>

<h2>Backends</h2>
<table><tr><th>name</th><th>kind</th><th>health</th><th>ping</th></tr>
{{range .Backends}}<tr><td>{{.Name}}</td><td>{{.Kind}}</td>{{if .Healthy}}<td>ok</td>{{else}}<td class="bad">{{.ErrorKind}}: {{.Error}}</td>{{end}}<td class="num">{{if .Pinged}}{{ms .PingMs}}{{else}}not pingable{{end}}</td></tr>
{{else}}<tr><td colspan="4">none</td></tr>
{{end}}</table>

<h2>Circuit breakers</h2>
<table><tr><th>source</th><th>server</th><th>state</th><th>rejected</th></tr>
{{range .Breakers}}<tr><td>{{.Source}}</td><td>{{.Server}}</td><td{{if ne .State "closed"}} class="bad"{{end}}>{{.State}}</td><td class="num">{{.Rejected}}</td></tr>
{{else}}<tr><td colspan="4">none</td></tr>
{{end}}</table>

<h2>Rollouts</h2>
<table><tr><th>name</th><th>mode</th><th>split</th><th>source</th><th>last fetch</th><th>source errors</th><th>mirrored</th><th>diverged</th><th>seeded (checked)</th><th>shortfalls</th><th>secondary errors</th><th>shadow compared</th><th>mismatches (allowed/denied, denied/allowed, remaining, reset)</th></tr>
{{range .Rollouts}}<tr><td>{{.Name}}</td><td>{{.Mode}}</td><td{{if .Killed}} class="bad"{{end}}>{{.Split}}</td>
{{with .Source}}<td{{if not .Healthy}} class="bad"{{end}}>{{.Kind}}: {{if .Healthy}}ok{{else}}{{.Error}}{{end}}</td>
<td>{{if .LastFetch}}{{.LastFetch.Format "2006-01-02T15:04:05Z07:00"}} ({{age .FetchAgeSeconds}} ago){{else}}n/a{{end}}</td>
<td>{{.Errors}}{{if .LastError}}, last: {{.LastError}}{{end}}</td>{{end}}
{{with .Stats}}<td class="num">{{.Mirrored}}</td><td class="num">{{.MirrorDiverged}}</td><td class="num">{{.Seeded}} ({{.SeedChecks}})</td><td class="num">{{.MirrorShortfalls}} ({{.MirrorShortfallUnits}} units)</td><td class="num">{{.SecondaryErrors}}</td><td class="num">{{.ShadowCompared}}</td>
<td class="num">{{.ShadowMismatches}} ({{.MismatchesByKind.AllowedDenied}}, {{.MismatchesByKind.DeniedAllowed}}, {{.MismatchesByKind.RemainingDiffers}}, {{.MismatchesByKind.ResetDiffers}})</td>{{end}}</tr>
{{else}}<tr><td colspan="13">none</td></tr>
{{end}}</table>

<h2>Policies</h2>
<table><tr><th>policy</th><th>limit</th><th>spec</th><th>algorithm</th><th>max</th><th>window</th><th>burst</th></tr>
{{range $p := .Policies}}{{range .Limits}}<tr><td>{{$p.Name}}</td><td>{{.Name}}</td><td>{{.Spec}}</td><td>{{.Algorithm}}</td><td class="num">{{.Max}}</td><td>{{.Window}}</td><td class="num">{{if .Burst}}{{.Burst}}{{end}}</td></tr>
{{end}}{{else}}<tr><td colspan="7">none</td></tr>
{{end}}</table>

<h2>Heaviest denied identifiers</h2>
{{with .TopDenied}}<p>{{.Denials}} denials since {{.Since.Format "2006-01-02T15:04:05Z07:00"}} (denied {{index .ByOutcome "denied"}}, cached {{index .ByOutcome "cached"}}, local {{index .ByOutcome "local_denied"}}); {{.Tracked}} of {{.K}} counters in use. Each count overestimates by at most its error.</p>
<table><tr><th>#</th><th>policy</th><th>identifier</th><th>denials</th><th>error</th></tr>
{{range $i, $d := .Heaviest}}<tr><td class="num">{{inc $i}}</td><td>{{$d.Policy}}</td><td>{{$d.Identifier}}</td><td class="num">{{$d.Count}}</td><td class="num">{{$d.Err}}</td></tr>
{{else}}<tr><td colspan="5">no denials yet</td></tr>
{{end}}</table>{{end}}
</body></html>
`))
