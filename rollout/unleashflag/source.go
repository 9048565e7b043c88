package unleashflag

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Unleash/unleash-client-go/v4"
	"github.com/Unleash/unleash-client-go/v4/api"

	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// ErrUnsupportedToggle reports an Unleash toggle whose strategies cannot be
// read as one sticky percentage (constraints, segments, dependencies,
// random stickiness, another group ID, a strategy other than flexibleRollout
// or default). The Source keeps the last split it had and reports the
// error.
var ErrUnsupportedToggle = errors.New("unleashflag: toggle is not a sticky percentage")

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
//     on the old backend;
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
// its default side. When the server cannot be reached, the client keeps its
// last fetched set and the source its last split. The source does not read
// or write the client's backup file: a restarted process starts from the
// default until the server answers.
type Source struct {
	feature   string
	groupID   string
	onError   func(error)
	client    *unleash.Client
	split     atomic.Pointer[rollout.Split]
	updates   atomic.Uint64
	rejected  atomic.Uint64
	errs      atomic.Uint64
	lastErr   atomic.Pointer[error]
	lastSplit atomic.Int64 // Unix nanoseconds of the last published split
	closeOnce sync.Once
}

// DefaultHTTPTimeout bounds each request of the Unleash client unless
// the caller passes an HTTP client of its own: the client's default,
// http.DefaultClient, waits for ever on a server that hangs.
const DefaultHTTPTimeout = 10 * time.Second

// Option configures an Source.
type Option func(*config)

type config struct {
	groupID string
	onError func(error)
	client  []unleash.ConfigOption
}

// WithClientOptions passes options to the Unleash client: at least
// unleash.WithUrl and unleash.WithAppName, usually
// unleash.WithRefreshInterval and authorisation headers.
//
// The source sets two defaults these may override: metrics are disabled
// (unleash.WithDisableMetrics(true)), since the source never calls
// IsEnabled and has no usage to report, which also spares New
// the client's synchronous registration request; and the HTTP client times
// out after DefaultHTTPTimeout. It installs its own storage
// (unleash.WithStorage) and listener (unleash.WithListener), which cannot be
// overridden; use WithErrorHandler to see the client's errors.
func WithClientOptions(opts ...unleash.ConfigOption) Option {
	return func(c *config) { c.client = append(c.client, opts...) }
}

// WithGroupID pins the group ID the toggle's flexibleRollout
// strategies must carry; the default is the feature name.
func WithGroupID(groupID string) Option {
	return func(c *config) { c.groupID = groupID }
}

// WithErrorHandler sets a function called with the client's errors
// (failed fetches) and with every rejected toggle. It is called from the
// client's goroutines, never on the request path; a rejection is reported
// while the client holds its repository lock, so the function must not
// block or call the client.
func WithErrorHandler(f func(error)) Option {
	return func(c *config) { c.onError = f }
}

// New starts an Unleash client and returns a source that follows
// the toggle named feature. Close it to stop the client. The error wraps
// driver.ErrInvalidOption, or is the client's.
func New(feature string, opts ...Option) (*Source, error) {
	if feature == "" {
		return nil, fmt.Errorf("%w: empty feature name", driver.ErrInvalidOption)
	}
	cfg := config{groupID: feature}
	for _, opt := range opts {
		opt(&cfg)
	}
	s := &Source{feature: feature, groupID: cfg.groupID, onError: cfg.onError}
	// Defaults first, so that the caller's options override them; the
	// storage and listener last, because the source needs its own.
	clientOpts := []unleash.ConfigOption{
		unleash.WithDisableMetrics(true),
		unleash.WithHttpClient(&http.Client{Timeout: DefaultHTTPTimeout}),
	}
	clientOpts = append(append(clientOpts, cfg.client...),
		unleash.WithStorage(&toggleStorage{source: s}),
		unleash.WithListener(listener{source: s}))
	client, err := unleash.NewClient(clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("unleashflag: unleash client: %w", err)
	}
	s.client = client
	return s, nil
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
	s.closeOnce.Do(func() { err = s.client.Close() })
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
	// LastError is the latest client error or rejection, or nil.
	LastError error
	// LastUpdate is when the latest split was published; zero before.
	LastUpdate time.Time
}

// Status returns the source's history.
func (s *Source) Status() Status {
	st := Status{Split: s.split.Load(), Updates: s.updates.Load(), Rejected: s.rejected.Load(),
		Errors: s.errs.Load()}
	if e := s.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	if ns := s.lastSplit.Load(); ns != 0 {
		st.LastUpdate = time.Unix(0, ns)
	}
	return st
}

// update reads a freshly fetched toggle set and publishes its split.
func (s *Source) update(features map[string]any) {
	var toggle *api.Feature
	if f, ok := features[s.feature].(api.Feature); ok {
		toggle = &f
	}
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
		return nil, fmt.Errorf("%w: toggle %q: %s", ErrUnsupportedToggle, name, fmt.Sprintf(format, args...))
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
		return 0, fmt.Errorf("groupId %q, want %q (a new group ID would move identifiers both ways)", gid, groupID)
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
			return 0, fmt.Errorf("rollout %q is not a number", v)
		}
		rollout = f
	default:
		return 0, fmt.Errorf("rollout %v is missing or not a number", params["rollout"])
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
	l.source.report(fmt.Errorf("unleashflag: unleash client: %w", err))
}

func (l listener) OnWarning(error) {}

var (
	_ rollout.FlagSource    = (*Source)(nil)
	_ unleash.Storage       = (*toggleStorage)(nil)
	_ unleash.ErrorListener = listener{}
)
