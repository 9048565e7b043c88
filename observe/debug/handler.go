package debugpage

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Defaults of a Handler.
const (
	// DefaultTopK is how many of the heaviest denied identifiers the page
	// shows.
	DefaultTopK = 100
	// DefaultPingTimeout bounds each backend's ping when the page loads.
	DefaultPingTimeout = time.Second
	// topKShards splits the sketch so that denials of different
	// identifiers rarely contend; each shard counts k keys.
	topKShards = 8
)

// Option configures a Handler.
type Option func(*Handler) error

// WithBackend lists a backend under name: the page pings it (when it
// implements driver.Pinger) on every load, and shows its circuit breakers
// when it reports them (redisbackend's Backend.Breakers, breaker.Backend).
func WithBackend(name string, b driver.Backend) Option {
	return func(h *Handler) error {
		if name == "" || b == nil {
			return fmt.Errorf("%w: WithBackend needs a name and a backend", throttler.ErrInvalidOption)
		}
		h.backends = append(h.backends, namedBackend{name, b})
		return nil
	}
}

// WithBreakers adds a source of breaker states under name, for breakers the
// backends do not report themselves (a breaker.Set of your own).
func WithBreakers(name string, statuses func() []breaker.Status) Option {
	return func(h *Handler) error {
		if name == "" || statuses == nil {
			return fmt.Errorf("%w: WithBreakers needs a name and a function", throttler.ErrInvalidOption)
		}
		h.breakers = append(h.breakers, namedBreakers{name, statuses})
		return nil
	}
}

// WithRollout shows a rollout under name: its mode, the split in force, its
// source's freshness and its counters.
func WithRollout(name string, b *rollout.Backend) Option {
	return func(h *Handler) error {
		if name == "" || b == nil {
			return fmt.Errorf("%w: WithRollout needs a name and a backend", throttler.ErrInvalidOption)
		}
		h.rollouts = append(h.rollouts, namedRollout{name, b})
		return nil
	}
}

// WithPolicies lists the policies in use.
func WithPolicies(policies ...*throttler.Policy) Option {
	return func(h *Handler) error {
		for _, p := range policies {
			if p == nil {
				return fmt.Errorf("%w: WithPolicies: a nil policy", throttler.ErrInvalidOption)
			}
		}
		h.policies = append(h.policies, policies...)
		return nil
	}
}

// WithTopK sets how many of the heaviest denied identifiers the page shows
// (DefaultTopK unless set), which also fixes the sketch's memory.
func WithTopK(k int) Option {
	return func(h *Handler) error {
		if k < 1 || k > 10000 {
			return fmt.Errorf("%w: WithTopK(%d): want 1 to 10000", throttler.ErrInvalidOption, k)
		}
		h.k = k
		return nil
	}
}

// WithPingTimeout bounds each backend's ping (DefaultPingTimeout unless
// set).
func WithPingTimeout(d time.Duration) Option {
	return func(h *Handler) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithPingTimeout(%v)", throttler.ErrInvalidOption, d)
		}
		h.pingTimeout = d
		return nil
	}
}

type namedBackend struct {
	name string
	b    driver.Backend
}

type namedBreakers struct {
	name     string
	statuses func() []breaker.Status
}

type namedRollout struct {
	name string
	b    *rollout.Backend
}

// Handler is the debug page: an http.Handler to mount on an internal port.
// Its Observer feeds the heaviest denied identifiers. It is safe for
// concurrent use.
type Handler struct {
	backends    []namedBackend
	breakers    []namedBreakers
	rollouts    []namedRollout
	policies    []*throttler.Policy
	k           int
	pingTimeout time.Duration
	denied      *topK
	started     time.Time
	now         func() time.Time
}

// New returns a Handler. A bad option is an error wrapping
// throttler.ErrInvalidOption.
func New(opts ...Option) (*Handler, error) {
	h := &Handler{k: DefaultTopK, pingTimeout: DefaultPingTimeout, now: time.Now}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", throttler.ErrInvalidOption)
		}
		if err := o(h); err != nil {
			return nil, err
		}
	}
	h.denied = newTopK(topKShards, h.k)
	h.started = h.now()
	return h, nil
}

// Observer returns the throttler.Observer that feeds the page's heaviest
// denied identifiers: give it to throttler.WithObserver. It counts every
// denial, those of the deny cache included, by policy and identifier; an
// allowed decision costs it one branch.
func (h *Handler) Observer() throttler.Observer { return (*deniedObserver)(h) }

type deniedObserver Handler

// Observe implements throttler.Observer.
func (o *deniedObserver) Observe(_ context.Context, e throttler.Event) {
	if e.Op != "allow" || e.Result.Allowed || !e.HasResult() {
		return
	}
	o.denied.add(topKKey{e.Policy, e.Identifier})
}

// Page is what the page shows; ?format=json returns it as JSON.
type Page struct {
	GeneratedAt time.Time `json:"generated_at"`
	Uptime      string    `json:"uptime"`
	Backends    []Backend `json:"backends"`
	Breakers    []Breaker `json:"breakers"`
	Rollouts    []Rollout `json:"rollouts"`
	Policies    []Policy  `json:"policies"`
	TopDenied   TopDenied `json:"top_denied"`
}

// Backend is one backend's health.
type Backend struct {
	Name string `json:"name"`
	// Kind is the backend's Go type, such as *redisbackend.Backend.
	Kind string `json:"kind"`
	// Healthy reports a successful ping; a backend that cannot be pinged
	// is taken to be healthy, and Pinged is false.
	Healthy bool    `json:"healthy"`
	Pinged  bool    `json:"pinged"`
	PingMs  float64 `json:"ping_ms"`
	Error   string  `json:"error,omitempty"`
}

// Breaker is one circuit breaker's state.
type Breaker struct {
	// Source is the backend or WithBreakers name the breaker comes from.
	Source   string `json:"source"`
	Server   string `json:"server"`
	State    string `json:"state"`
	Rejected uint64 `json:"rejected"`
}

// Rollout is a rollout's split, source and counters.
type Rollout struct {
	Name string `json:"name"`
	Mode string `json:"mode"`
	// Split is the split in force ("30% new (group g)"), or "none yet"
	// before the source's first answer, when the default side serves.
	Split      string `json:"split"`
	PercentNew int    `json:"percent_new"`
	Killed     bool   `json:"killed"`
	GroupID    string `json:"group_id,omitempty"`
	// Source describes the flag source: its type, whether its last fetch
	// was answered, and when (sources that fetch, such as Unleash).
	SourceKind   string        `json:"source_kind"`
	SourceHealth string        `json:"source_health"`
	LastFetch    *time.Time    `json:"last_fetch,omitempty"`
	FetchAgeSecs float64       `json:"fetch_age_seconds,omitempty"`
	Stats        rollout.Stats `json:"stats"`
}

// Policy is a policy in use and its limits.
type Policy struct {
	Name   string  `json:"name"`
	Spec   string  `json:"spec"`
	Limits []Limit `json:"limits"`
}

// Limit is one limit of a policy.
type Limit struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"`
	Max       int64  `json:"max"`
	Window    string `json:"window"`
	Burst     int64  `json:"burst,omitempty"`
}

// TopDenied is the heaviest denied identifiers: Count overestimates an
// identifier's denials by at most Err (a Space-Saving sketch of K entries
// per shard, so memory stays fixed whatever the number of identifiers).
type TopDenied struct {
	K        int      `json:"k"`
	Denials  uint64   `json:"denials"`
	Tracked  int      `json:"tracked"`
	Heaviest []Denied `json:"heaviest"`
}

// Denied is one of the heaviest denied identifiers.
type Denied struct {
	Policy     string `json:"policy"`
	Identifier string `json:"identifier"`
	Count      uint64 `json:"count"`
	Err        uint64 `json:"err"`
}

// Snapshot gathers the page: it pings every backend (concurrently, each
// within the ping timeout) and reads breakers, rollouts and the sketch.
func (h *Handler) Snapshot(ctx context.Context) Page {
	now := h.now()
	p := Page{GeneratedAt: now.UTC(), Uptime: now.Sub(h.started).Round(time.Second).String()}
	p.Backends = make([]Backend, len(h.backends))
	var wg sync.WaitGroup
	for i, nb := range h.backends {
		p.Backends[i] = Backend{Name: nb.name, Kind: fmt.Sprintf("%T", nb.b), Healthy: true}
		pg, ok := nb.b.(driver.Pinger)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, h.pingTimeout)
			defer cancel()
			start := time.Now()
			err := pg.Ping(pctx)
			b := &p.Backends[i]
			b.Pinged, b.PingMs = true, float64(time.Since(start).Microseconds())/1000
			if err != nil {
				b.Healthy, b.Error = false, err.Error()
			}
		}()
	}
	for _, nr := range h.rollouts {
		p.Rollouts = append(p.Rollouts, h.rolloutOf(ctx, nr, now))
	}
	for _, pol := range h.policies {
		p.Policies = append(p.Policies, policyOf(pol))
	}
	top, seen := h.denied.top(h.k)
	p.TopDenied = TopDenied{K: h.k, Denials: seen, Tracked: h.denied.len(), Heaviest: make([]Denied, 0, len(top))}
	for _, e := range top {
		p.TopDenied.Heaviest = append(p.TopDenied.Heaviest, Denied{Policy: e.Key.policy, Identifier: e.Key.id, Count: e.Count, Err: e.Err})
	}
	wg.Wait()
	// Breakers are read after the pings, which they may have answered.
	for _, nb := range h.backends {
		if r, ok := nb.b.(interface{ Breakers() []breaker.Status }); ok {
			p.Breakers = appendBreakers(p.Breakers, nb.name, r.Breakers())
		}
	}
	for _, nb := range h.breakers {
		p.Breakers = appendBreakers(p.Breakers, nb.name, nb.statuses())
	}
	return p
}

func appendBreakers(out []Breaker, source string, statuses []breaker.Status) []Breaker {
	for _, s := range statuses {
		out = append(out, Breaker{Source: source, Server: s.Server, State: s.State.String(), Rejected: s.Rejected})
	}
	return out
}

func (h *Handler) rolloutOf(ctx context.Context, nr namedRollout, now time.Time) Rollout {
	src := nr.b.Source()
	r := Rollout{Name: nr.name, Mode: nr.b.Mode().String(), Split: "none yet", SourceKind: fmt.Sprintf("%T", src),
		SourceHealth: "ok", Stats: nr.b.Stats()}
	if sp := src.Split(); sp != nil {
		r.Split, r.PercentNew, r.Killed, r.GroupID = sp.String(), sp.Percent(), sp.Killed(), sp.GroupID()
	}
	if pg, ok := src.(interface{ Ping(context.Context) error }); ok {
		pctx, cancel := context.WithTimeout(ctx, h.pingTimeout)
		if err := pg.Ping(pctx); err != nil {
			r.SourceHealth = err.Error()
		}
		cancel()
	}
	if f, ok := src.(interface{ LastFetch() time.Time }); ok {
		if t := f.LastFetch(); !t.IsZero() {
			t = t.UTC()
			r.LastFetch, r.FetchAgeSecs = &t, now.Sub(t).Seconds()
		}
	}
	return r
}

func policyOf(p *throttler.Policy) Policy {
	out := Policy{Name: p.Name(), Spec: p.String()}
	for _, l := range p.Limits() {
		alg := l.Algorithm.String()
		out.Limits = append(out.Limits, Limit{Name: cmpOr(l.Name, l.String()), Algorithm: alg, Max: l.Max,
			Window: l.Window.String(), Burst: l.Burst})
	}
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// ServeHTTP serves the page: HTML, or JSON with ?format=json. Only GET and
// HEAD are served.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	page := h.Snapshot(r.Context())
	w.Header().Set("Cache-Control", "no-store")
	switch r.URL.Query().Get("format") {
	case "json":
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(page)
	case "", "html":
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = pageTemplate.Execute(w, page)
	default:
		http.Error(w, "unknown format: want html or json", http.StatusBadRequest)
	}
}

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{"inc": func(i int) int { return i + 1 }}).Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>throttlekit</title>
<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#f3f3f3}.bad{color:#b00}</style></head>
<body><h1>throttlekit</h1><p>Generated {{.GeneratedAt.Format "2006-01-02T15:04:05Z07:00"}}, up {{.Uptime}}. <a href="?format=json">JSON</a></p>
<h2>Backends</h2><table><tr><th>name</th><th>kind</th><th>health</th><th>ping</th></tr>
{{range .Backends}}<tr><td>{{.Name}}</td><td>{{.Kind}}</td><td{{if not .Healthy}} class="bad"{{end}}>{{if .Healthy}}ok{{else}}{{.Error}}{{end}}</td><td>{{if .Pinged}}{{printf "%.2f" .PingMs}} ms{{else}}not pingable{{end}}</td></tr>
{{else}}<tr><td colspan="4">none</td></tr>{{end}}</table>
<h2>Circuit breakers</h2><table><tr><th>source</th><th>server</th><th>state</th><th>rejected</th></tr>
{{range .Breakers}}<tr><td>{{.Source}}</td><td>{{.Server}}</td><td{{if ne .State "closed"}} class="bad"{{end}}>{{.State}}</td><td>{{.Rejected}}</td></tr>
{{else}}<tr><td colspan="4">none</td></tr>{{end}}</table>
<h2>Rollouts</h2><table><tr><th>name</th><th>mode</th><th>split</th><th>source</th><th>last fetch</th><th>mirrored</th><th>shortfalls</th><th>secondary errors</th><th>shadow compared</th><th>mismatches</th></tr>
{{range .Rollouts}}<tr><td>{{.Name}}</td><td>{{.Mode}}</td><td>{{.Split}}</td><td>{{.SourceKind}}: {{.SourceHealth}}</td><td>{{if .LastFetch}}{{printf "%.1f" .FetchAgeSecs}} s ago{{else}}n/a{{end}}</td><td>{{.Stats.Mirrored}}</td><td>{{.Stats.MirrorShortfalls}}</td><td>{{.Stats.SecondaryErrors}}</td><td>{{.Stats.ShadowCompared}}</td><td>{{.Stats.ShadowMismatches}}</td></tr>
{{else}}<tr><td colspan="10">none</td></tr>{{end}}</table>
<h2>Policies</h2><table><tr><th>policy</th><th>limit</th><th>algorithm</th><th>max</th><th>window</th><th>burst</th></tr>
{{range $p := .Policies}}{{range .Limits}}<tr><td>{{$p.Name}}</td><td>{{.Name}}</td><td>{{.Algorithm}}</td><td>{{.Max}}</td><td>{{.Window}}</td><td>{{if .Burst}}{{.Burst}}{{end}}</td></tr>
{{end}}{{else}}<tr><td colspan="6">none</td></tr>{{end}}</table>
<h2>Heaviest denied identifiers</h2><p>{{.TopDenied.Denials}} denials seen; the top {{.TopDenied.K}}, counts overestimated by at most err.</p>
<table><tr><th>#</th><th>policy</th><th>identifier</th><th>denials</th><th>err</th></tr>
{{range $i, $d := .TopDenied.Heaviest}}<tr><td>{{inc $i}}</td><td>{{$d.Policy}}</td><td>{{$d.Identifier}}</td><td>{{$d.Count}}</td><td>{{$d.Err}}</td></tr>
{{else}}<tr><td colspan="5">no denials yet</td></tr>{{end}}</table>
</body></html>
`))
