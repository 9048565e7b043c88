package unleashflag

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Unleash/unleash-client-go/v4"
	"github.com/Unleash/unleash-client-go/v4/api"
	unleashctx "github.com/Unleash/unleash-client-go/v4/context"

	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// ErrUnsupportedToggle reports an Unleash toggle whose strategies cannot be
// read as one sticky percentage (constraints, segments, dependencies,
// random stickiness, another group ID, a strategy other than flexibleRollout
// or default). The Source keeps the last split it had and reports the
// error.
var ErrUnsupportedToggle = errors.New("throttlekit: unleashflag: toggle is not a sticky percentage")

// Source is a rollout.FlagSource read from an Unleash toggle through the
// official Go client (github.com/Unleash/unleash-client-go/v4). The toggle's
// flexibleRollout percentage says which identifiers the new backend serves;
// the identifier is the value its stickiness hashes.
//
// The client fetches the toggles in the background every refresh interval
// (with ETag / If-None-Match, so an unchanged toggle costs a 304). Each time
// it stores a fetched set, the source reads the toggle into a Split and
// publishes it atomically; Split is then one atomic load. The client's
// IsEnabled is never called on the request path: it takes the repository's
// read lock, copies the toggle, and (unless metrics are disabled) sends on
// an unbuffered channel per call; with default stickiness and no userId it
// even hashes a random number, which would scatter one identifier's counts
// over both backends.
//
// How a toggle reads as a split:
//
//   - missing from the fetched set, or disabled: the kill switch, everything
//     on the old backend. A missing toggle is more often a typo than a
//     deletion, so it is also reported: Ping returns ErrToggleMissing,
//     Status counts the sets without it, and the source logs one Error
//     line (and one Info line when the toggle appears);
//   - enabled without strategies, or with the "default" strategy: 100%;
//   - flexibleRollout strategies (rollout as a number or a string, any
//     stickiness but "random", the pinned group ID): the largest rollout,
//     rounded down to a whole percent, which is exactly what the client
//     itself would evaluate with the identifier in the stickiness field;
//   - anything else (constraints, segments, dependencies, random
//     stickiness, another group ID, other strategies): rejected with
//     ErrUnsupportedToggle, keeping the last split.
//
// The group ID is pinned (WithGroupID; the feature name by default,
// which is what the Unleash UI fills in) because the hash covers it: a
// changed group ID would reshuffle every identifier, breaking stickiness and
// monotonicity, so a toggle with another one is rejected.
//
// Until the first successful fetch Split returns nil, and the Backend uses
// its default side; WithWaitForFirstFetch makes New wait for that fetch
// and fail clearly when the server refuses the client or does not answer.
// When the server cannot be reached later, the client keeps its last
// fetched set and the source its last split, and Ping reports the failure.
// The source does not read or write the client's backup file: a restarted
// process starts from the default until the server answers.
//
// Identifiers outside ASCII: the split hashes the identifier's bytes as the
// Go client does (MurmurHash3 of "groupId:identifier" in UTF-8). Unleash's
// own evaluator in Node.js, which its UI and its playground use, has hashed
// strings with characters outside ASCII differently in some versions, so
// for such identifiers what the playground shows may differ from what the
// Go client, and so this source, decides. The Go client is the one that
// decides here; compare with it, not with the playground.
type Source struct {
	feature    string
	groupID    string
	onError    func(error)
	client     *unleash.Client
	split      atomic.Pointer[rollout.Split]
	updates    atomic.Uint64
	rejected   atomic.Uint64
	errs       atomic.Uint64
	lastErr    atomic.Pointer[error]
	lastSplit  atomic.Int64 // Unix nanoseconds of the last published split
	lastAnswer atomic.Int64 // Unix nanoseconds of the last answered fetch
	// fetchStart and fetchEnd are when the latest fetch started and when
	// the latest one ended (Unix nanoseconds); interval is the time between
	// the starts of the two latest fetches of which the first took less
	// than half of it: the refresh interval as the source sees it, which a
	// slow fetch (and the client's ticker catching up after it) leaves
	// alone.
	fetchStart atomic.Int64
	fetchEnd   atomic.Int64
	interval   atomic.Int64
	staleAfter time.Duration // WithStaleAfter; 0 for the default
	created    time.Time
	// missing is set while the latest fetched set lacks the toggle;
	// missingFetches counts such sets. The Error line goes out when
	// missing is set, once until the toggle is seen again.
	missing        atomic.Bool
	missingFetches atomic.Uint64
	logger         atomic.Pointer[slog.Logger] // SetLogger's; slog.Default() when nil
	closeOnce      sync.Once

	// fetch is the state of the latest request for the toggles, recorded
	// by the HTTP transport: see Ping.
	fetch      atomic.Pointer[fetchResult]
	firstFetch chan struct{} // closed by the first answered request
	firstOnce  sync.Once
	stop       chan struct{} // closed by Close; ends the usage reporter
}

// fetchResult is what the latest request for the toggles got.
type fetchResult struct {
	at     time.Time
	status int   // the HTTP status, 0 when there was no answer
	err    error // the transport's error, without the URL's credentials
}

// DefaultHTTPTimeout bounds each request of the Unleash client unless
// the caller passes an HTTP client of its own: the client's default,
// http.DefaultClient, waits for ever on a server that hangs.
const DefaultHTTPTimeout = 10 * time.Second

// Option configures a Source (New).
type Option interface {
	apply(*config) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	groupID    string
	onError    func(error)
	client     []unleash.ConfigOption
	url        string
	appName    string
	serverSet  bool
	httpClient *http.Client
	wait       time.Duration
	usage      bool
	token      string
	headers    http.Header
	staleAfter time.Duration
}

// Bounds of Ping's staleness check: see WithStaleAfter.
const (
	// StaleIntervals is how many refresh intervals without an answer make
	// Ping report the server, unless WithStaleAfter says otherwise.
	StaleIntervals = 3
	// DefaultRefreshInterval is the Unleash client's own refresh interval,
	// which the default bound counts in until the source has seen two
	// fetches start.
	DefaultRefreshInterval = 15 * time.Second
)

// WithStaleAfter sets how long the server may go without answering a fetch
// of the toggles before Ping reports it, whether the fetch in flight has
// failed yet or not: a hung server holds a fetch until the HTTP client's
// timeout (DefaultHTTPTimeout), longer than a health check should wait to
// learn of it. The default is StaleIntervals refresh intervals, as the
// source sees them (the time between the starts of the last two fetches;
// DefaultRefreshInterval before it has seen two). d must not be negative;
// 0 keeps the default.
func WithStaleAfter(d time.Duration) Option {
	return optionFunc(func(c *config) error { c.staleAfter = d; return nil })
}

// WithServer names the Unleash server and this application: apiURL is the
// server's API root, ending in /api (as in http://unleash:4242/api), and
// appName is how Unleash lists this application. It is required. New
// checks both before it starts anything, so a bad value costs nothing but
// an error wrapping driver.ErrInvalidOption; in particular a URL without
// /api, which the client would accept and then only ever get 404s from.
// These override unleash.WithUrl and unleash.WithAppName.
func WithServer(apiURL, appName string) Option {
	return optionFunc(func(c *config) error { c.url, c.appName, c.serverSet = apiURL, appName, true; return nil })
}

// WithToken sets the client API token the Unleash server expects in the
// Authorization header.
func WithToken(token string) Option {
	return optionFunc(func(c *config) error { c.token = token; return nil })
}

// WithHeaders sets headers sent with every request to the Unleash server
// (a proxy's, say); WithToken's Authorization wins over one given here.
// The source gives its client a copy: the Unleash client writes into the
// header map it is handed, so one map passed to two clients with
// unleash.WithCustomHeaders is a data race, which these options avoid.
func WithHeaders(h http.Header) Option {
	return optionFunc(func(c *config) error { c.headers = h.Clone(); return nil })
}

// WithHTTPClient sets the HTTP client the Unleash client uses (one with a
// timeout of DefaultHTTPTimeout unless set). The source wraps its
// transport to see every answer to a fetch, for Ping; pass the HTTP client
// here rather than with unleash.WithHttpClient, which this overrides.
func WithHTTPClient(c *http.Client) Option {
	return optionFunc(func(cfg *config) error { cfg.httpClient = c; return nil })
}

// WithWaitForFirstFetch makes New wait, up to timeout, for the first answer
// of the server. New then fails fast and clearly instead of routing
// everyone to the default side in silence: with an error wrapping
// ErrRefused when the server refuses the token or does not know the path
// (HTTP 401, 403 or 404), or ErrNotReady when it cannot be reached or has
// not answered within timeout. The client is stopped before New returns
// the error. Without this option New returns at once and the first fetch
// happens in the background.
func WithWaitForFirstFetch(timeout time.Duration) Option {
	return optionFunc(func(c *config) error { c.wait = timeout; return nil })
}

// WithUsageMetrics reports the toggle's use to Unleash, so that the toggle
// does not look unused in Unleash's UI (an unused toggle invites archiving,
// and an archived toggle is a kill switch). The source never evaluates the
// toggle on the request path; with this option it evaluates it once every
// UsageInterval off that path, and the client sends its usual metrics
// (registration at start, counts every metrics interval).
func WithUsageMetrics() Option {
	return optionFunc(func(c *config) error { c.usage = true; return nil })
}

// UsageInterval is how often a source with WithUsageMetrics evaluates its
// toggle for the client's metrics.
const UsageInterval = 10 * time.Second

// Errors of a source that cannot follow its toggle.
var (
	// ErrRefused reports that the server answered a fetch of the toggles
	// with 401, 403 or 404: a token it refuses, or a URL that is not its
	// API root. The client backs off to its longest interval after one.
	ErrRefused = errors.New("throttlekit: unleashflag: unleash server refused the client")
	// ErrNotReady reports a source that has had no answer from its server:
	// not yet (WithWaitForFirstFetch timed out), or not at its latest
	// attempt (Ping).
	ErrNotReady = errors.New("throttlekit: unleashflag: no answer from the unleash server")
	// ErrToggleMissing reports that the latest set of toggles the server
	// sent has none of the source's name: a typo, a toggle not created yet
	// or deleted, or one in a project or environment the token does not
	// see. It reads as the kill switch (everything on the old backend), as
	// a deleted toggle must, so Ping reports it and the source logs it.
	ErrToggleMissing = errors.New("throttlekit: unleashflag: toggle does not exist on the unleash server")
)

// WithClientOptions passes options to the Unleash client, usually
// unleash.WithRefreshInterval. Give the token and headers with WithToken
// and WithHeaders rather than unleash.WithCustomHeaders, whose map the
// client writes into (a map shared between two sources is a data race).
//
// The source disables the client's metrics unless WithUsageMetrics is
// given, since it never calls IsEnabled on its own and so has no usage to
// report (which also spares New the client's synchronous registration
// request). It sets the URL and application name (WithServer), the HTTP
// client (WithHTTPClient), its own storage (unleash.WithStorage) and
// listener (unleash.WithListener); those cannot be overridden here. Use
// WithErrorHandler to see the client's errors.
func WithClientOptions(opts ...unleash.ConfigOption) Option {
	return optionFunc(func(c *config) error { c.client = append(c.client, opts...); return nil })
}

// WithGroupID pins the group ID the toggle's flexibleRollout
// strategies must carry; the default is the feature name.
func WithGroupID(groupID string) Option {
	return optionFunc(func(c *config) error { c.groupID = groupID; return nil })
}

// WithErrorHandler sets a function called with the client's errors
// (failed fetches) and with every rejected toggle. It is called from the
// client's goroutines, never on the request path; a rejection is reported
// while the client holds its repository lock, so the function must not
// block or call the client.
func WithErrorHandler(f func(error)) Option {
	return optionFunc(func(c *config) error { c.onError = f; return nil })
}

// New checks its options, starts an Unleash client and returns a source
// that follows the toggle named feature. Close it to stop the client.
// Nothing is started when New returns an error: a bad option wraps
// driver.ErrInvalidOption; with WithWaitForFirstFetch, a server that
// refuses the client gives ErrRefused and one that does not answer
// ErrNotReady.
func New(feature string, opts ...Option) (*Source, error) {
	if feature == "" {
		return nil, driver.Errorf("%w: empty feature name", driver.ErrInvalidOption)
	}
	cfg := config{groupID: feature}
	for _, opt := range opts {
		if opt == nil {
			return nil, driver.Errorf("%w: unleashflag: nil Option", driver.ErrInvalidOption)
		}
		if err := opt.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	s := &Source{feature: feature, groupID: cfg.groupID, onError: cfg.onError,
		firstFetch: make(chan struct{}), stop: make(chan struct{}),
		staleAfter: cfg.staleAfter, created: time.Now()}
	hc := &http.Client{Timeout: DefaultHTTPTimeout}
	if cfg.httpClient != nil {
		c := *cfg.httpClient
		hc = &c
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc.Transport = &recorder{base: base, source: s}
	// The caller's options first, so that what the source needs wins.
	clientOpts := append([]unleash.ConfigOption{unleash.WithDisableMetrics(!cfg.usage)}, cfg.client...)
	clientOpts = append(clientOpts,
		unleash.WithUrl(cfg.url),
		unleash.WithAppName(cfg.appName),
		unleash.WithHttpClient(hc),
		unleash.WithStorage(&toggleStorage{source: s}),
		unleash.WithListener(listener{source: s}))
	if cfg.token != "" || cfg.headers != nil {
		// A map of this client's own, whatever the caller shares.
		hdr := cfg.headers.Clone()
		if hdr == nil {
			hdr = http.Header{}
		}
		if cfg.token != "" {
			hdr.Set("Authorization", cfg.token)
		}
		clientOpts = append(clientOpts, unleash.WithCustomHeaders(hdr))
	}
	if cfg.usage {
		clientOpts = append(clientOpts, unleash.WithDisableMetrics(false))
	}
	client, err := unleash.NewClient(clientOpts...)
	if err != nil {
		// Not reached with checked options: the client fails only on a
		// missing URL or application name, or a URL it cannot parse.
		return nil, driver.Errorf("throttlekit: unleashflag: unleash client: %w", err)
	}
	s.client = client
	if cfg.wait > 0 {
		if err := s.waitFirstFetch(cfg.wait); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	if cfg.usage {
		go s.reportUsage()
	}
	return s, nil
}

// check validates the options before anything starts.
func (c *config) check() error {
	if !c.serverSet {
		return driver.Errorf("%w: unleashflag.New needs WithServer(apiURL, appName)", driver.ErrInvalidOption)
	}
	if c.appName == "" {
		return driver.Errorf("%w: empty Unleash application name", driver.ErrInvalidOption)
	}
	if c.wait < 0 {
		return driver.Errorf("%w: WithWaitForFirstFetch(%v) is negative", driver.ErrInvalidOption, c.wait)
	}
	if c.staleAfter < 0 {
		return driver.Errorf("%w: WithStaleAfter(%v) is negative", driver.ErrInvalidOption, c.staleAfter)
	}
	u, err := url.Parse(c.url)
	if err != nil {
		// url.Error quotes the whole URL, credentials included: say less.
		return driver.Errorf("%w: Unleash URL does not parse", driver.ErrInvalidOption)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return driver.Errorf("%w: Unleash URL %s: scheme must be http or https", driver.ErrInvalidOption, u.Redacted())
	case u.Host == "":
		return driver.Errorf("%w: Unleash URL %s has no host", driver.ErrInvalidOption, u.Redacted())
	case !strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/api"):
		return driver.Errorf("%w: Unleash URL %s does not end in /api: the client would fetch %s/client/features and get 404",
			driver.ErrInvalidOption, u.Redacted(), strings.TrimSuffix(u.Redacted(), "/"))
	}
	return nil
}

// waitFirstFetch waits for the first answer to a fetch, up to timeout.
func (s *Source) waitFirstFetch(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-s.firstFetch:
	case <-t.C:
		return driver.Errorf("%w within %v: %v", ErrNotReady, timeout, s.fetchError())
	}
	if err := s.fetchError(); err != nil {
		return err
	}
	// The answer was a 200: the storage has the toggles once the client
	// has stored them, an instant after the response.
	for deadline := time.Now().Add(timeout); s.split.Load() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return driver.Errorf("%w within %v: the toggles were fetched but not stored", ErrNotReady, timeout)
		}
		if err := s.lastErr.Load(); err != nil {
			return *err // the toggle was rejected (ErrUnsupportedToggle)
		}
	}
	return nil
}

// fetchError describes the latest fetch, nil when it was answered with
// 200 or 304.
func (s *Source) fetchError() error {
	f := s.fetch.Load()
	switch {
	case f == nil:
		return driver.Errorf("%w: no fetch yet", ErrNotReady)
	case f.status == http.StatusOK || f.status == http.StatusNotModified:
		return nil
	case f.status == http.StatusUnauthorized || f.status == http.StatusForbidden || f.status == http.StatusNotFound:
		return driver.Errorf("%w: HTTP %d at %s (a token the server refuses, or a URL that is not its API root)",
			ErrRefused, f.status, f.at.Format(time.RFC3339))
	case f.status != 0:
		return driver.Errorf("%w: HTTP %d at %s", ErrNotReady, f.status, f.at.Format(time.RFC3339))
	}
	return driver.Errorf("%w: %v at %s", ErrNotReady, f.err, f.at.Format(time.RFC3339))
}

// Ping reports the source's health, for health checks and rollout.Backend's
// Ping: nil when the latest fetch of the toggles was answered (200 or 304),
// the server has answered one within the stale bound (WithStaleAfter:
// by default StaleIntervals refresh intervals) and the toggle was in the
// set it sent; otherwise an error wrapping ErrRefused, ErrNotReady or
// ErrToggleMissing. A server that hangs is therefore reported
// within the bound, while the fetch in flight still waits for its answer.
// The split in force stays whatever it was (see Split). The error never
// holds the token.
func (s *Source) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.fetchError(); err != nil {
		return err
	}
	bound := s.StaleBound()
	if silent := time.Since(s.LastFetch()); silent > bound {
		return driver.Errorf("%w: no answer for %v, more than %v (a fetch is in flight since %s)", ErrNotReady,
			silent.Round(time.Millisecond), bound, time.Unix(0, s.fetchStart.Load()).Format(time.RFC3339Nano))
	}
	if s.missing.Load() {
		return driver.Errorf("%w: %q is not in the toggles the server sent (a typo? a project or environment the token does not see?); everything is on the old backend",
			ErrToggleMissing, s.feature)
	}
	return nil
}

// StaleBound returns how long the server may go without answering before
// Ping reports it: WithStaleAfter's, or StaleIntervals refresh intervals as
// the source has seen them.
func (s *Source) StaleBound() time.Duration {
	if s.staleAfter > 0 {
		return s.staleAfter
	}
	iv := time.Duration(s.interval.Load())
	if iv <= 0 {
		iv = DefaultRefreshInterval
	}
	return StaleIntervals * iv
}

// reportUsage evaluates the toggle every UsageInterval, off the request
// path, so that the client's metrics report it as used.
func (s *Source) reportUsage() {
	t := time.NewTicker(UsageInterval)
	defer t.Stop()
	for {
		s.client.IsEnabled(s.feature, unleash.WithContext(unleashctx.Context{UserId: "throttlekit"}))
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// recorder is the HTTP transport of the Unleash client: it passes requests
// on and records the outcome of each fetch of the toggles.
type recorder struct {
	base   http.RoundTripper
	source *Source
}

// RoundTrip implements http.RoundTripper.
func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	fetch := strings.HasSuffix(req.URL.Path, "/client/features")
	if fetch {
		s := r.source
		now := time.Now().UnixNano()
		prevStart, prevEnd := s.fetchStart.Swap(now), s.fetchEnd.Load()
		if gap := now - prevStart; prevStart != 0 && prevEnd >= prevStart && prevEnd-prevStart < gap/2 {
			s.interval.Store(gap)
		}
	}
	resp, err := r.base.RoundTrip(req)
	if fetch {
		r.source.fetchEnd.Store(time.Now().UnixNano())
		f := &fetchResult{at: time.Now()}
		if err != nil {
			f.err = errors.New("no answer (" + redactedCause(err) + ")")
		} else {
			f.status = resp.StatusCode
		}
		s := r.source
		s.fetch.Store(f)
		if f.status == http.StatusOK || f.status == http.StatusNotModified {
			s.lastAnswer.Store(f.at.UnixNano())
		}
		s.firstOnce.Do(func() { close(s.firstFetch) })
	}
	return resp, err
}

// redactedCause is a transport error without the URL (which url.Error
// quotes, credentials included).
func redactedCause(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return err.Error()
}

// Split returns the split read from the last fetched toggle, or nil before
// the first successful fetch.
func (s *Source) Split() *rollout.Split { return s.split.Load() }

// Client returns the Unleash client, for instance to wait for it with
// WaitForReady or to evaluate other toggles.
func (s *Source) Client() *unleash.Client { return s.client }

// Close stops the client. It is safe to call more than once.
func (s *Source) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stop)
		err = s.client.Close()
	})
	return err
}

// Status describes an Source's history.
type Status struct {
	// Split is the split in force, nil before the first answer.
	Split *rollout.Split
	// Updates counts fetched toggle sets the source read into a split.
	Updates uint64
	// Rejected counts fetched toggles that were not a sticky percentage
	// (ErrUnsupportedToggle).
	Rejected uint64
	// Errors counts the client's errors, such as failed fetches.
	Errors uint64
	// Missing reports that the latest fetched set had no toggle of the
	// source's name (ErrToggleMissing): the kill switch is in force.
	Missing bool
	// MissingFetches counts fetched sets that had no toggle of the
	// source's name.
	MissingFetches uint64
	// LastError is the latest client error or rejection, or nil.
	LastError error
	// LastUpdate is when the latest split was published; zero before.
	LastUpdate time.Time
	// LastFetch is when the server last answered a fetch of the toggles
	// (200 or 304): how fresh the split in force is. Zero before.
	LastFetch time.Time
}

// MissingFetches counts the fetched toggle sets that had no toggle of the
// source's name (rollout.MissingCounter), as Status.MissingFetches does.
func (s *Source) MissingFetches() uint64 { return s.missingFetches.Load() }

// LastFetch returns when the server last answered a fetch of the toggles
// (200 or 304), zero before the first answer: how fresh the split in force
// is. Status reports it too.
func (s *Source) LastFetch() time.Time {
	if ns := s.lastAnswer.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Status returns the source's history.
func (s *Source) Status() Status {
	st := Status{Split: s.split.Load(), Updates: s.updates.Load(), Rejected: s.rejected.Load(),
		Errors: s.errs.Load(), Missing: s.missing.Load(), MissingFetches: s.missingFetches.Load()}
	if e := s.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	if ns := s.lastSplit.Load(); ns != 0 {
		st.LastUpdate = time.Unix(0, ns)
	}
	if ns := s.lastAnswer.Load(); ns != 0 {
		st.LastFetch = time.Unix(0, ns)
	}
	return st
}

// update reads a freshly fetched toggle set and publishes its split.
func (s *Source) update(features map[string]any) {
	var toggle *api.Feature
	if f, ok := features[s.feature].(api.Feature); ok {
		toggle = &f
	}
	s.noteMissing(toggle == nil)
	sp, err := readToggle(toggle, s.feature, s.groupID)
	if err != nil {
		s.rejected.Add(1)
		s.report(err)
		return
	}
	s.split.Store(sp)
	s.updates.Add(1)
	s.lastSplit.Store(time.Now().UnixNano())
}

// noteMissing counts a fetched set without the toggle, and logs once, at
// Error, when the toggle goes missing (on the first fetch, for a name with
// a typo), and at Info when it is seen again: a missing toggle is the kill
// switch, which nobody notices by its effect.
func (s *Source) noteMissing(missing bool) {
	if missing {
		s.missingFetches.Add(1)
	}
	if s.missing.Swap(missing) == missing {
		return
	}
	if missing {
		s.log().Error("throttlekit: unleashflag: toggle does not exist on the unleash server: everything stays on the old backend until it does (a typo in its name? a project or environment the token does not see?)",
			"toggle", s.feature)
		return
	}
	s.log().Info("throttlekit: unleashflag: toggle found on the unleash server; its split is in force", "toggle", s.feature)
}

func (s *Source) log() *slog.Logger {
	if l := s.logger.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// SetLogger implements driver.LoggerSetter: the source logs to l (nowhere
// for a nil l) instead of slog.Default(). It logs one line when the toggle
// is missing from a fetched set (ErrToggleMissing) and one when it is back.
// rollout.Backend passes it the throttler's logger.
func (s *Source) SetLogger(l *slog.Logger) { s.logger.Store(driver.LoggerOrDiscard(l)) }

func (s *Source) report(err error) {
	s.lastErr.Store(&err)
	if s.onError != nil {
		s.onError(err)
	}
}

// readToggle turns a toggle (nil when missing) into a split, as the Unleash
// client would evaluate it with the identifier in the stickiness field.
func readToggle(f *api.Feature, name, groupID string) (*rollout.Split, error) {
	if f == nil || !f.Enabled {
		return rollout.KillSwitch(groupID), nil
	}
	reject := func(format string, args ...any) (*rollout.Split, error) {
		return nil, driver.Errorf("%w: toggle %q: %s", ErrUnsupportedToggle, name, fmt.Sprintf(format, args...))
	}
	if f.Dependencies != nil && len(*f.Dependencies) > 0 {
		return reject("has dependencies")
	}
	if len(f.Strategies) == 0 {
		return rollout.NewSplit(100, groupID)
	}
	percent := 0
	for _, st := range f.Strategies {
		if len(st.Constraints) > 0 || len(st.Segments) > 0 {
			return reject("strategy %q has constraints or segments", st.Name)
		}
		switch st.Name {
		case "default":
			percent = 100
		case "flexibleRollout":
			p, err := readFlexibleRollout(st.Parameters, groupID)
			if err != nil {
				return reject("%v", err)
			}
			percent = max(percent, p)
		default:
			return reject("strategy %q is not flexibleRollout", st.Name)
		}
	}
	return rollout.NewSplit(percent, groupID)
}

// readFlexibleRollout returns a flexibleRollout strategy's percentage,
// rounded down to a whole percent: buckets are whole numbers, so bucket <=
// 37.5 holds exactly when bucket <= 37.
func readFlexibleRollout(params api.ParameterMap, groupID string) (int, error) {
	gid, _ := params["groupId"].(string)
	if gid != groupID {
		return 0, driver.Errorf("groupId %q, want %q (a new group ID would move identifiers both ways)", gid, groupID)
	}
	stickiness, _ := params["stickiness"].(string)
	if stickiness == "random" {
		return 0, errors.New("random stickiness is not sticky")
	}
	var rollout float64
	switch v := params["rollout"].(type) {
	case float64:
		rollout = v
	case int:
		rollout = float64(v)
	case int64:
		rollout = float64(v)
	case uint32:
		rollout = float64(v)
	case string:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, driver.Errorf("rollout %q is not a number", v)
		}
		rollout = f
	default:
		return 0, driver.Errorf("rollout %v is missing or not a number", params["rollout"])
	}
	if math.IsNaN(rollout) {
		return 0, errors.New("rollout is NaN")
	}
	return int(math.Floor(min(max(rollout, 0), 100))), nil
}

// toggleStorage is the client's storage (unleash.Storage): an in-memory map,
// like the client's default one without its backup file, that also hands
// every fetched set to the source. The client calls Reset after each
// successful fetch, and calls Get, List and Reset under its own lock.
type toggleStorage struct {
	source *Source
	data   map[string]any
}

func (t *toggleStorage) Init(backupPath, appName string) { t.data = map[string]any{} }

func (t *toggleStorage) Reset(data map[string]any, persist bool) error {
	t.data = data
	t.source.update(data)
	return nil
}

func (t *toggleStorage) Load() error { return nil }

func (t *toggleStorage) Persist() error { return nil }

func (t *toggleStorage) Get(key string) (any, bool) {
	v, ok := t.data[key]
	return v, ok
}

func (t *toggleStorage) List() []any {
	out := make([]any, 0, len(t.data))
	for _, v := range t.data {
		out = append(out, v)
	}
	return out
}

// listener receives the client's errors (unleash.ErrorListener). The
// client needs a listener: without one its internal channels would fill.
type listener struct{ source *Source }

func (l listener) OnError(err error) {
	l.source.errs.Add(1)
	l.source.report(driver.Errorf("throttlekit: unleashflag: unleash client: %w", err))
}

func (l listener) OnWarning(error) {}

var (
	_ rollout.FlagSource     = (*Source)(nil)
	_ rollout.MissingCounter = (*Source)(nil)
	_ driver.LoggerSetter    = (*Source)(nil)
	_ unleash.Storage        = (*toggleStorage)(nil)
	_ unleash.ErrorListener  = listener{}
)
