package redisbackend_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// pipelineSizes is a go-redis hook that records the size of every
// pipeline the client sends, in script calls (a batch call counts
// as the decisions it carries).
type pipelineSizes struct {
	mu    sync.Mutex
	sizes []int
	many  int // batch calls among them
}

func (h *pipelineSizes) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *pipelineSizes) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return next
}
func (h *pipelineSizes) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		n, many := 0, 0
		for _, cmd := range cmds {
			d, isMany := decisionsIn(cmd)
			n += d
			if isMany {
				many++
			}
		}
		h.mu.Lock()
		h.sizes = append(h.sizes, n)
		h.many += many
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// decisionsIn is the number of script calls cmd stands for: the count of
// decisions it carries for a batch call (many is then true), else 1. A
// batch call's ARGV holds the grace, the number of policies, each policy
// (its number of limits n, then six values per limit), and then the count
// of decisions.
func decisionsIn(cmd goredis.Cmder) (n int, many bool) {
	args := cmd.Args()
	if len(args) < 6 || cmd.Name() != "evalsha" || !redisbackend.IsBatchHash(fmt.Sprint(args[1])) {
		return 1, false
	}
	number := func(i int) int {
		if i >= len(args) {
			return -1
		}
		v, err := strconv.Atoi(fmt.Sprint(args[i]))
		if err != nil {
			return -1
		}
		return v
	}
	pos := 6 // args[3] the key, args[4] the grace, args[5] the number of policies
	for range number(5) {
		pos += 1 + 6*number(pos)
	}
	if c := number(pos); c > 0 {
		return c, true
	}
	return 1, false
}

func (h *pipelineSizes) manyCalls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.many
}

func (h *pipelineSizes) get() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.sizes...)
}

func TestWithBatchingRejectsBadOptions(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	_, err := redisbackend.New(c, redisbackend.WithBatching(-1))
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
	ap, err := c.AutoPipeline()
	require.NoError(t, err)
	_, err = redisbackend.New(ap, redisbackend.WithBatching(0))
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
}

// Decisions that arrive while a round trip is in flight go out together
// in the next one, and a batch fails only its own failing decisions: one
// whose key holds a foreign value gets ErrForeignValue, one whose deadline
// passes while it waits gets context.DeadlineExceeded, and every other
// decision of the batch is decided normally. The decisions go as one call
// of the policy shape's batch script, the script cache was flushed before, so the batch
// also meets NOSCRIPT and recovers from it.
func TestBatchFailsOnlyItsFailingDecisions(t *testing.T) {
	ctx := context.Background()
	server := ownRedis(t)
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	sizes := &pipelineSizes{}
	client.AddHook(sizes)
	b := mustBackend(t, client, redisbackend.WithPrefix(newPrefix()), redisbackend.WithBatching(0))
	p := testkit.Compiled(t, "batch", "5/min, 50/h")
	req := func(id string) driver.Request {
		return driver.Request{Policy: p, Identifier: id, Cost: 1, Now: t0}
	}
	_, err := b.Decide(ctx, req("warm-up"))
	require.NoError(t, err)
	admin := newClient(t, server.Addr())
	require.NoError(t, admin.ScriptFlush(ctx).Err())
	require.NoError(t, admin.Set(ctx, b.Key(p, "foreign"), "junk", time.Minute).Err())

	// The server holds every command for 1.5 s: the first call goes out
	// alone and waits; the rest queue behind it. (On a busy machine the
	// callers' goroutines may take a few hundred ms to start; they must all
	// have queued before the server answers.)
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", 1500, "ALL").Err())
	first := make(chan error, 1)
	go func() {
		_, err := b.Peek(ctx, driver.Request{Policy: p, Identifier: "first", Now: t0})
		first <- err
	}()
	time.Sleep(50 * time.Millisecond)

	const n = 20
	var wg sync.WaitGroup
	var normal atomic.Int64
	errs := make(map[string]error)
	var mu sync.Mutex
	call := func(id string, timeout time.Duration) {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		out, err := b.Decide(ctx, req(id))
		mu.Lock()
		errs[id] = err
		mu.Unlock()
		if err == nil && out.Allowed && out.States[0].Used == 1 {
			normal.Add(1)
		}
	}
	wg.Add(n + 2)
	go call("foreign", 5*time.Second)
	go call("hurried", 100*time.Millisecond) // ends while the server is paused
	for i := range n {
		go call(fmt.Sprintf("user:%d", i), 5*time.Second)
	}
	wg.Wait()
	require.NoError(t, <-first)

	assert.ErrorIs(t, errs["foreign"], redisbackend.ErrForeignValue)
	assert.ErrorIs(t, errs["hurried"], context.DeadlineExceeded)
	assert.EqualValues(t, n, normal.Load(), "every other decision of the batch is decided normally: %v", errs)
	// The decisions queued while the server was paused went out in a few
	// round trips, not one each: two senders (two round trips in flight)
	// may share them, so more than one pipeline may carry them.
	sent := sizes.get()
	t.Logf("pipelines sent: %v", sent)
	assert.LessOrEqual(t, len(sent), 4, "the queued decisions went out together")
	total := 0
	for _, k := range sent {
		total += k
	}
	assert.GreaterOrEqual(t, total, n, "the decisions went out in pipelines")
	assert.Positive(t, sizes.manyCalls(), "a standalone client's batch of decisions is one batch call")
}

// inFlightMeter is a go-redis hook that records the most pipelines of
// script calls in flight at once on a client. A new connection's setup
// (HELLO, CLIENT SETINFO) is a pipeline of its own, run inside the first
// pipeline sent on it: it is not counted.
type inFlightMeter struct {
	now, most atomic.Int64
}

func (h *inFlightMeter) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *inFlightMeter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *inFlightMeter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if !slices.ContainsFunc(cmds, func(c goredis.Cmder) bool { return strings.HasPrefix(c.Name(), "eval") }) {
			return next(ctx, cmds)
		}
		n := h.now.Add(1)
		defer h.now.Add(-1)
		for {
			most := h.most.Load()
			if n <= most || h.most.CompareAndSwap(most, n) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

// A batcher keeps at most WithRoundTripsInFlight round trips in flight to
// its server, however many callers wait: 64 goroutines decide over 1,000
// identifiers while a hook counts the pipelines in flight. With one, the
// count never passes one; by default, never two. A count below one is an
// invalid option.
func TestRoundTripsInFlight(t *testing.T) {
	ctx := context.Background()
	server := ownRedis(t)
	p := testkit.Compiled(t, "inflight", "1000000/h")
	for _, tc := range []struct {
		name string
		opts []redisbackend.Option
		most int64
	}{
		{"default", nil, 2},
		{"one", []redisbackend.Option{redisbackend.WithRoundTripsInFlight(1)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true, PoolSize: 64})
			t.Cleanup(func() { _ = client.Close() })
			meter := &inFlightMeter{}
			client.AddHook(meter)
			b := mustBackend(t, client, append([]redisbackend.Option{redisbackend.WithPrefix(newPrefix())}, tc.opts...)...)
			var wg sync.WaitGroup
			var failed atomic.Int64
			for g := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 200 {
						ctx, cancel := context.WithTimeout(ctx, testkit.CallTimeout)
						_, err := b.Decide(ctx, driver.Request{Policy: p, Identifier: fmt.Sprint("user:", (g*200+i)%1000), Cost: 1, Now: t0})
						cancel()
						if err != nil {
							failed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			require.Zero(t, failed.Load())
			t.Logf("most round trips in flight: %d", meter.most.Load())
			assert.LessOrEqual(t, meter.most.Load(), tc.most)
			assert.Positive(t, meter.most.Load(), "the decisions went in pipelines")
		})
	}
	c := newClient(t, server.Addr())
	_, err := redisbackend.New(c, redisbackend.WithRoundTripsInFlight(0))
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
}
