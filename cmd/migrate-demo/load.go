package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/rollout"
)

// observation is what a client reads from one response.
type observation struct {
	status   int
	received time.Time
	// latency is how long the client waited for the response.
	latency time.Duration
	side    rollout.Side
	store   string
	// degraded responses carry no state headers: the failure mode made
	// their figures up.
	degraded bool
	// member is the binding limit's name, from the RateLimit field
	// ("core:30/10s"): Reset and Used are that limit's.
	member    string
	limit     int64 // X-RateLimit-Limit, the binding limit's quota
	reset     int64 // X-RateLimit-Reset, Unix seconds
	used      int64 // X-RateLimit-Used
	remaining int64 // X-RateLimit-Remaining
	r         int64 // RateLimit's r parameter
	// resultRemaining is the throttler's own Remaining, sent on denials
	// (headerResultRemaining); used is then the throttler's Used too.
	resultRemaining int64
}

var errBadResponse = errors.New("unexpected response")

// readObservation reads the status and headers of a response received at
// received. A status other than 200 and 429, or a response without the
// headers the API always sends, is an error wrapping errBadResponse.
func readObservation(status int, h http.Header, received time.Time) (observation, error) {
	o := observation{status: status, received: received}
	if status != http.StatusOK && status != http.StatusTooManyRequests {
		return o, fmt.Errorf("%w: status %d", errBadResponse, status)
	}
	switch h.Get(headerSide) {
	case rollout.SideOld.String():
		o.side = rollout.SideOld
	case rollout.SideNew.String():
		o.side = rollout.SideNew
	default:
		return o, fmt.Errorf("%w: no %s header", errBadResponse, headerSide)
	}
	o.store = h.Get(headerStore)
	if h.Get(middleware.HeaderDegraded) == "1" {
		o.degraded = true
		return o, nil
	}
	var ok bool
	if o.member, o.r, ok = parseRateLimit(h.Get(middleware.HeaderRateLimit)); !ok {
		return o, fmt.Errorf("%w: RateLimit %q", errBadResponse, h.Get(middleware.HeaderRateLimit))
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{middleware.HeaderLimit, &o.limit}, {middleware.HeaderReset, &o.reset}, {middleware.HeaderUsed, &o.used},
		{middleware.HeaderRemaining, &o.remaining}} {
		v, err := strconv.ParseInt(h.Get(f.name), 10, 64)
		if err != nil {
			return o, fmt.Errorf("%w: %s %q", errBadResponse, f.name, h.Get(f.name))
		}
		*f.dst = v
	}
	if status == http.StatusTooManyRequests {
		// The standard headers force Remaining 0 and Used = Limit on a
		// denial; the throttler's own figures say what the store held.
		for _, f := range []struct {
			name string
			dst  *int64
		}{{headerResultRemaining, &o.resultRemaining}, {headerResultUsed, &o.used}} {
			v, err := strconv.ParseInt(h.Get(f.name), 10, 64)
			if err != nil {
				return o, fmt.Errorf("%w: %s %q", errBadResponse, f.name, h.Get(f.name))
			}
			*f.dst = v
		}
	}
	return o, nil
}

// parseRateLimit reads the IETF RateLimit field the middleware writes, one
// list member such as `"core:30/10s";r=0;t=7`, and returns the member's
// name and its r parameter.
func parseRateLimit(v string) (member string, r int64, ok bool) {
	v = strings.TrimSpace(v)
	if !strings.HasPrefix(v, `"`) {
		return "", 0, false
	}
	var name strings.Builder
	i := 1
	for ; i < len(v) && v[i] != '"'; i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		name.WriteByte(v[i])
	}
	if i >= len(v) {
		return "", 0, false
	}
	found := false
	for _, param := range strings.Split(v[i+1:], ";") {
		key, value, _ := strings.Cut(strings.TrimSpace(param), "=")
		if key != "r" {
			continue
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return "", 0, false
		}
		r, found = n, true
	}
	return name.String(), r, found
}

// judgement is what one response shows against what its client saw
// before.
type judgement struct {
	// quotaClaim: a denial whose headers claim remaining quota.
	quotaClaim bool
	// moved: another side, or another store of the same side, decided the
	// previous response (the legacy limiter, memcached, redis; the shards
	// of one store count as one).
	moved bool
	// checked: moved while the binding limit's window was certainly open,
	// so that its Reset and Used must have carried over.
	checked bool
	// resetChange: the binding limit's X-RateLimit-Reset changed while its
	// window was certainly open, or went back.
	resetChange bool
	// doubleGrant: the window granted more than its quota, or gave back
	// units it had counted (see judge).
	doubleGrant bool
}

// windowSeen is what a client has seen of one limit's current window:
// the responses whose binding limit it was.
type windowSeen struct {
	// reset is the window's X-RateLimit-Reset, which names it.
	reset int64
	// used is the largest X-RateLimit-Used seen in it (the throttler's own
	// Used on a denial); allowed counts its allowed responses.
	used, allowed int64
}

// add records cur, a response of the window, or one that opens the next.
func (w *windowSeen) add(cur observation) {
	if cur.reset != w.reset {
		*w = windowSeen{reset: cur.reset}
	}
	w.used = max(w.used, cur.used)
	if cur.status == http.StatusOK {
		w.allowed++
	}
}

// judge compares cur with what its client saw before: prev, its previous
// non-degraded response (nil for the first), and win, the window of cur's
// binding limit as earlier responses showed it (nil when none did).
//
// X-RateLimit-Reset is the window end E rounded up to a second, R, so E
// lies in (R-1, R]. A response received before R-1 was decided while that
// window was certainly open: it must show the same R. A response after
// that may come from a new window, which always ends later (R' >= R); a
// Reset that goes back is wrong at any time. Either is a ResetAt change.
//
// Responses that show the same R are of one window, and the client is the
// only one that spends its token's quota, one request at a time. So, in
// one window: every allowed response spends a unit, its Used above every
// earlier Used and at most the limit, and the allowed responses number at
// most the limit; and no response shows a Used below an earlier one
// (units given back, to be granted again). A response that breaks any of
// these is a double grant.
//
// Windows are followed per limit (the RateLimit field's member), so that
// nothing is compared across limits.
func judge(prev *observation, win *windowSeen, cur observation) judgement {
	var j judgement
	if cur.degraded {
		return j
	}
	// A cost-1 denial leaves nothing (SPEC: denied implies Remaining 0),
	// in the headers and in the store's figures behind them.
	j.quotaClaim = cur.status == http.StatusTooManyRequests && (cur.remaining > 0 || cur.r > 0 || cur.resultRemaining > 0)
	if prev != nil {
		j.moved = cur.side != prev.side || storeKind(cur.store) != storeKind(prev.store)
	}
	if win == nil {
		return j
	}
	open := cur.received.UnixMilli() < (win.reset-1)*1000
	j.checked = j.moved && open
	if cur.reset != win.reset {
		j.resetChange = cur.reset < win.reset || open
		return j
	}
	if cur.status == http.StatusOK {
		j.doubleGrant = cur.used <= win.used || cur.used > cur.limit || win.allowed+1 > cur.limit
	} else {
		j.doubleGrant = cur.used < win.used
	}
	return j
}

// storeKind names the store of an X-Demo-Store value: "redis" for
// "redis/a".
func storeKind(store string) string {
	kind, _, _ := strings.Cut(store, "/")
	return kind
}

// sideCounts are one phase's figures for responses from one side.
type sideCounts struct {
	requests, allowed, denied, degraded     int64
	resetChanges, doubleGrants, quotaClaims int64
	moved, checked                          int64
	// contradictions counts results that contradict the store (see
	// contradicts), on the side of the contradicting result.
	contradictions int64
	// rolled counts windows that rolled over: responses that showed the
	// next window of their limit, not a ResetAt change.
	rolled int64
}

func (a *sideCounts) add(b sideCounts) {
	a.requests += b.requests
	a.allowed += b.allowed
	a.denied += b.denied
	a.degraded += b.degraded
	a.resetChanges += b.resetChanges
	a.doubleGrants += b.doubleGrants
	a.quotaClaims += b.quotaClaims
	a.moved += b.moved
	a.checked += b.checked
	a.contradictions += b.contradictions
	a.rolled += b.rolled
}

// clientPhase is one client's record of one phase.
type clientPhase struct {
	sides  [2]sideCounts
	errors int64
	// seen says the client had a response in the phase to a request sent
	// in it; lastSide and lastStore are the side and store of the last
	// such response. A request sent before the phase began may have been
	// decided on the split before, so its response counts in the phase's
	// figures but not in its shares.
	seen      bool
	lastSide  rollout.Side
	lastStore string
	// decisions counts responses by the store that decided them
	// (X-Demo-Store), degraded ones included; latencies holds the time
	// each response took.
	decisions map[string]int64
	latencies []time.Duration
}

// client is one API token, driven by one goroutine that sends requests
// one after another, so that its responses come in order.
type client struct {
	token   string
	abusive bool
	// legacy clients are served by the hand-written limiter until the
	// deploy.
	legacy   bool
	interval time.Duration
	// start delays the first request, so that windows, which open at an
	// identifier's first request, do not all open and close in step.
	start time.Duration
	// mu guards phases; the driving goroutine reads the current phase and
	// records under it, so that a collector that has moved the phase on
	// and then taken mu sees every record of the phase before.
	mu     sync.Mutex
	phases []clientPhase
	// prev is the last non-degraded response, windows the current window
	// of each limit; only the driver uses them.
	prev    *observation
	windows map[string]*windowSeen
	// trails follows, per limit, the non-degraded responses whose binding
	// limit it was, to count the results that contradict the store.
	trails map[string]*trail
	// mirrored is the phase in which the client received the response to
	// its first request sent after the deploy that the store decided (not
	// degraded), -1 until then. From the
	// next phase on, a mirror holds its identifier on both stores, and no
	// write of it should find the other store apart.
	mirrored int
}

// load is the load generator: one client per identifier, over real HTTP.
type load struct {
	url       string
	http      *http.Client
	transport *http.Transport
	clients   []*client
	// phase is the index records go to; the extra last slot takes what
	// arrives after the run's end.
	phase atomic.Int32
	// deployed is set once requests reach the rollout.
	deployed atomic.Bool
	samples  errorSamples
	// evidence keeps the first responses that broke an invariant.
	evidence errorSamples
	// timeline counts responses per second of the run.
	timeline timeline
}

// newLoad prepares cfg.Identifiers clients of url, for phases phases.
// Abusive clients are spread evenly among the others; legacy marks those
// the hand-written limiter serves before the deploy. Their first requests
// are spread over stagger.
func newLoad(cfg Config, url string, phases int, stagger time.Duration, legacy func(token string) bool) *load {
	n := cfg.Identifiers
	tr := &http.Transport{
		Proxy:               nil, // loopback only
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        n + 16,
		MaxIdleConnsPerHost: n + 16,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	l := &load{url: url, transport: tr, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
	l.timeline.start = time.Now()
	for i := range n {
		abusive := int(float64(i+1)*cfg.AbusiveShare) > int(float64(i)*cfg.AbusiveShare)
		rate := cfg.NormalRate
		if abusive {
			rate = cfg.AbusiveRate
		}
		token := fmt.Sprintf("demo-%04d", i)
		l.clients = append(l.clients, &client{
			token:    token,
			abusive:  abusive,
			legacy:   legacy(token),
			windows:  map[string]*windowSeen{},
			trails:   map[string]*trail{},
			interval: time.Duration(float64(time.Second) / rate),
			start:    time.Duration(float64(stagger) * float64(i) / float64(n)),
			phases:   make([]clientPhase, phases+1),
			mirrored: -1,
		})
	}
	return l
}

// abusive returns the number of abusive clients.
func (l *load) abusive() int {
	n := 0
	for _, c := range l.clients {
		if c.abusive {
			n++
		}
	}
	return n
}

// legacy returns the number of clients that start on the hand-written
// limiter.
func (l *load) legacy() int {
	n := 0
	for _, c := range l.clients {
		if c.legacy {
			n++
		}
	}
	return n
}

// run drives every client until ctx is done or a client has sent
// maxRequests, and returns when all have stopped.
func (l *load) run(ctx context.Context, maxRequests int) {
	var wg sync.WaitGroup
	for i, c := range l.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.drive(ctx, c, uint64(i), maxRequests)
		}()
	}
	wg.Wait()
	l.transport.CloseIdleConnections()
}

// drive sends c's requests: the first after its start delay, then one per
// interval with ±50% jitter. A slow response delays the next request
// rather than bunching requests up after it.
func (l *load) drive(ctx context.Context, c *client, seed uint64, maxRequests int) {
	rng := rand.New(rand.NewPCG(seed, 0x6d69677261746521))
	timer := time.NewTimer(c.start + time.Duration(rng.Int64N(int64(c.interval/2))+1))
	defer timer.Stop()
	for range maxRequests {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		l.send(ctx, c)
		timer.Reset(time.Duration(float64(c.interval) * (0.5 + rng.Float64())))
	}
}

// send makes one request for c and records what its response shows.
func (l *load) send(ctx context.Context, c *client) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.url, nil)
	if err != nil {
		l.record(ctx, c, sending{}, observation{}, err)
		return
	}
	req.Header.Set(tokenHeader, "token "+c.token)
	sent := sending{phase: l.phase.Load(), deployed: l.deployed.Load()}
	start := time.Now()
	resp, err := l.http.Do(req)
	var obs observation
	if err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		_ = resp.Body.Close()
		received := time.Now()
		obs, err = readObservation(resp.StatusCode, resp.Header, received)
		obs.latency = received.Sub(start)
	}
	l.record(ctx, c, sent, obs, err)
}

// sending is what a request's sender knew when it sent it.
type sending struct {
	phase    int32 // the phase records went to
	deployed bool  // whether requests reached the rollout
}

// record adds one response, or the failure to get one, to the current
// phase of c. Failures caused by the run's end are not failures.
func (l *load) record(ctx context.Context, c *client, sent sending, obs observation, err error) {
	if ctx.Err() != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	phase := l.phase.Load()
	p := &c.phases[phase]
	l.timeline.add(time.Now(), obs, err)
	if err != nil {
		p.errors++
		l.samples.add(err)
		return
	}
	if p.decisions == nil {
		p.decisions = map[string]int64{}
	}
	p.decisions[obs.store]++
	p.latencies = append(p.latencies, obs.latency)
	win := c.windows[obs.member]
	j := judge(c.prev, win, obs)
	s := &p.sides[obs.side]
	s.requests++
	if obs.status == http.StatusOK {
		s.allowed++
	} else {
		s.denied++
	}
	if sent.phase == phase {
		p.seen, p.lastSide, p.lastStore = true, obs.side, obs.store
	}
	if obs.degraded {
		s.degraded++
		return
	}
	if sent.deployed && c.mirrored < 0 {
		// Decided by the store, not degraded: the mirror wrote it.
		c.mirrored = int(phase)
	}
	s.resetChanges += b2i(j.resetChange)
	s.doubleGrants += b2i(j.doubleGrant)
	s.quotaClaims += b2i(j.quotaClaim)
	s.moved += b2i(j.moved)
	s.checked += b2i(j.checked)
	s.rolled += b2i(win != nil && obs.reset != win.reset && !j.resetChange)
	for _, broken := range []struct {
		yes  bool
		name string
	}{{j.resetChange, "ResetAt change"}, {j.doubleGrant, "double grant"}, {j.quotaClaim, "denial claiming quota"}} {
		if broken.yes {
			l.evidence.addKindf(broken.name, "%s %s", c.token, describeChange(c.prev, win, obs))
		}
	}
	if win == nil {
		win = &windowSeen{}
		c.windows[obs.member] = win
	}
	win.add(obs)
	c.prev = &obs

	tr := c.trails[obs.member]
	if tr == nil {
		tr = &trail{}
		c.trails[obs.member] = tr
	}
	anchor := tr.anchor // next moves it on
	bad := tr.next(obs)
	l.timeline.contradicted(time.Now(), len(bad))
	for _, r := range bad {
		p.sides[r.side].contradictions++
		l.evidence.addKindf(contradictingKind, "%s %s", c.token, describeTrail(*anchor, r, obs))
	}
}

// contradictingKind names the evidence of results contradicting the
// store.
const contradictingKind = "result contradicting the store"

// maxSuspects bounds the responses a trail holds while it waits for the
// window they interrupt to show again.
const maxSuspects = 16

// trail follows the responses of one limit of one client, to count the
// results that contradict the store.
//
// The anchor is the latest response whose window the store is known to
// have held; suspects are the responses since, received while the
// anchor's window was certainly open (before its Reset minus a second),
// that showed another window. When a later response shows the anchor's
// window again, the store held that one window from before the anchor was
// decided until after that response was: a fixed window never comes back
// once ended, and two windows of one identifier cannot end within the same
// second. Every suspect, decided in between, then contradicts the store:
// a non-degraded result describing a window the store never held. So does
// a response of the anchor's window whose Used is below the anchor's (the
// client is the only one spending its token's quota, and nothing gives
// units back in the demo), or a suspect with the anchor's Reset whose Used
// lies outside the anchor's and the later response's. Used is
// X-RateLimit-Used on a 200, the throttler's own X-Demo-Result-Used on a
// 429 (the standard header says Limit there).
//
// A response that shows another window once the anchor's may have ended
// becomes the anchor, and suspects never confirmed are dropped: the
// ResetAt and double grant checks (judge) still judge each of them from
// what came before. A made-up result is counted here once, however many
// of those checks it also breaks.
type trail struct {
	anchor   *observation
	suspects []observation
}

// next adds n, the limit's next non-degraded response, and returns the
// responses it shows to contradict the store.
func (t *trail) next(n observation) []observation {
	a := t.anchor
	if a == nil {
		t.anchor = &n
		return nil
	}
	open := n.received.UnixMilli() < (a.reset-1)*1000
	switch {
	case n.reset == a.reset:
		var bad []observation
		for _, s := range t.suspects {
			if s.reset != a.reset || s.used < a.used || s.used > n.used {
				bad = append(bad, s)
			}
		}
		t.suspects = t.suspects[:0]
		if n.used < a.used {
			return append(bad, n)
		}
		t.anchor = &n
		return bad
	case open:
		if len(t.suspects) == maxSuspects {
			t.suspects = t.suspects[1:]
		}
		t.suspects = append(t.suspects, n)
		return nil
	}
	t.anchor, t.suspects = &n, t.suspects[:0]
	return nil
}

// describeTrail shows a contradicting response r of a limit between the
// anchor and n, which show the window the store held, for the evidence
// list.
func describeTrail(anchor, r, n observation) string {
	show := func(o observation) string {
		return fmt.Sprintf("[%d from %s, received %s: Reset %d Used %d]", o.status, o.store,
			o.received.Format("15:04:05.000"), o.reset, o.used)
	}
	return fmt.Sprintf("%s: %s between %s and %s", r.member, show(r), show(anchor), show(n))
}

// describeChange shows a response, the one before it and the window its
// limit was in, for the evidence list.
func describeChange(prev *observation, win *windowSeen, cur observation) string {
	show := func(o observation) string {
		return fmt.Sprintf("[%d from %s, received %s: %s Limit %d Reset %d Used %d Remaining %d r %d]", o.status,
			o.store, o.received.Format("15:04:05.000"), o.member, o.limit, o.reset, o.used, o.remaining, o.r)
	}
	s := show(cur)
	if prev != nil {
		s = show(*prev) + " then " + s
	}
	if win != nil {
		s += fmt.Sprintf(" (window Reset %d: %d allowed, Used up to %d)", win.reset, win.allowed, win.used)
	}
	return s
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// setPhase sends the records of responses received from now on to phase i.
func (l *load) setPhase(i int) { l.phase.Store(int32(i)) }

// phaseTotals are the figures of all clients for one phase.
type phaseTotals struct {
	sides  [2]sideCounts
	errors int64
	// ids counts identifiers by the side of their last response in the
	// phase (to a request sent in it); stores by its store, which
	// storeSides puts on its side; active is the identifiers that had any.
	ids        [2]int
	stores     map[string]int
	storeSides map[string]rollout.Side
	active     int
	// decisions counts responses by the store that decided them.
	decisions map[string]int64
	// unmirrored counts the clients that had no decided response to a
	// request sent after the deploy before the phase began: the identifiers whose
	// first mirrored write may fall in the phase.
	unmirrored int
}

func (t phaseTotals) all() sideCounts {
	s := t.sides[0]
	s.add(t.sides[1])
	return s
}

// collect sums phase i over all clients. After setPhase moved past i, the
// result is final.
func (l *load) collect(i int) phaseTotals {
	t := phaseTotals{stores: map[string]int{}, storeSides: map[string]rollout.Side{}, decisions: map[string]int64{}}
	for _, c := range l.clients {
		c.mu.Lock()
		p, mirrored := c.phases[i], c.mirrored
		for store, n := range p.decisions {
			t.decisions[store] += n
		}
		c.mu.Unlock()
		t.sides[0].add(p.sides[0])
		t.sides[1].add(p.sides[1])
		t.errors += p.errors
		if mirrored < 0 || mirrored >= i {
			t.unmirrored++
		}
		if p.seen {
			t.active++
			t.ids[p.lastSide]++
			t.stores[p.lastStore]++
			t.storeSides[p.lastStore] = p.lastSide
		}
	}
	return t
}

// latencies returns the 50th and 99th percentiles of the time responses
// recorded in phase i took; zero without responses.
func (l *load) latencies(i int) (p50, p99 time.Duration) {
	var all []time.Duration
	for _, c := range l.clients {
		c.mu.Lock()
		all = append(all, c.phases[i].latencies...)
		c.mu.Unlock()
	}
	return quantile(all, 0.50), quantile(all, 0.99)
}

// quantile returns the q-quantile of d (nearest rank), sorting d; zero
// when d is empty.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	if !sort.SliceIsSorted(d, func(i, j int) bool { return d[i] < d[j] }) {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	}
	rank := int(math.Ceil(q*float64(len(d)))) - 1
	return d[min(max(rank, 0), len(d)-1)]
}

// timeline counts responses per second since the load was made, for the
// report's charts over time.
type timeline struct {
	start   time.Time
	mu      sync.Mutex
	seconds []timeBucket
}

// timeBucket is one second of a timeline.
type timeBucket struct {
	// stores counts responses by the store that decided them (degraded
	// ones included); degraded and errors count those responses and the
	// failed requests.
	stores           map[string]int64
	allowed, denied  int64
	degraded, errors int64
	// contradictions counts results that contradict the store, in the
	// second the response that showed it arrived.
	contradictions int64
}

// add counts, at now, obs or the failure err.
func (t *timeline) add(now time.Time, obs observation, err error) {
	i := int(now.Sub(t.start) / time.Second)
	if i < 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.seconds) <= i {
		t.seconds = append(t.seconds, timeBucket{stores: map[string]int64{}})
	}
	b := &t.seconds[i]
	switch {
	case err != nil:
		b.errors++
		return
	case obs.status == http.StatusOK:
		b.allowed++
	default:
		b.denied++
	}
	if obs.degraded {
		b.degraded++
	}
	b.stores[obs.store]++
}

// contradicted counts n results contradicting the store, seen at now.
func (t *timeline) contradicted(now time.Time, n int) {
	i := int(now.Sub(t.start) / time.Second)
	if i < 0 || n == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.seconds) <= i {
		t.seconds = append(t.seconds, timeBucket{stores: map[string]int64{}})
	}
	t.seconds[i].contradictions += int64(n)
}

// snapshot returns a copy of the seconds counted so far.
func (t *timeline) snapshot() []timeBucket {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]timeBucket, len(t.seconds))
	for i, b := range t.seconds {
		out[i] = b
		out[i].stores = make(map[string]int64, len(b.stores))
		for k, v := range b.stores {
			out[i].stores[k] = v
		}
	}
	return out
}

// errorSamples keeps the first few distinct failure messages of each
// kind, for the report.
type errorSamples struct {
	mu    sync.Mutex
	msgs  map[string]int
	kinds map[string]int // distinct messages kept per kind
}

const maxErrorSamples = 5

func (e *errorSamples) add(err error) { e.addKindf("", "%v", err) }

// addKindf keeps "kind: message" unless maxErrorSamples others of the
// kind are kept already, so that frequent kinds do not hide rare ones.
func (e *errorSamples) addKindf(kind, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if kind != "" {
		msg = kind + ": " + msg
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.msgs == nil {
		e.msgs, e.kinds = map[string]int{}, map[string]int{}
	}
	if _, ok := e.msgs[msg]; ok {
		e.msgs[msg]++
	} else if e.kinds[kind] < maxErrorSamples {
		e.msgs[msg] = 1
		e.kinds[kind]++
	}
}

// list returns the samples, most frequent first.
func (e *errorSamples) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	msgs := make([]string, 0, len(e.msgs))
	for msg := range e.msgs {
		msgs = append(msgs, msg)
	}
	sort.Slice(msgs, func(i, j int) bool {
		if e.msgs[msgs[i]] != e.msgs[msgs[j]] {
			return e.msgs[msgs[i]] > e.msgs[msgs[j]]
		}
		return msgs[i] < msgs[j]
	})
	out := make([]string, len(msgs))
	for i, msg := range msgs {
		out[i] = fmt.Sprintf("%d× %s", e.msgs[msg], msg)
	}
	return out
}

// start runs the clients for about d, bounded in count too (twice the
// faster rate over d, with room for jitter), and returns the function that
// stops them and waits until every client has returned. Calling it again
// does nothing more, so a leg both stops its clients where its last phase
// ends and defers the same call for its early returns.
func (l *load) start(ctx context.Context, cfg Config, d time.Duration) (stop func()) {
	maxRequests := int(d.Seconds()*max(cfg.NormalRate, cfg.AbusiveRate)*2) + 10
	loadCtx, cancel := context.WithTimeout(ctx, d+5*time.Second)
	var done sync.WaitGroup
	done.Add(1)
	go func() {
		defer done.Done()
		l.run(loadCtx, maxRequests)
	}()
	return func() {
		cancel()
		done.Wait()
	}
}
