package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ulule/limiter/v3"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// memCell is one implementation whose Redis memory per identifier is
// measured: every identifier decided once on an emptied server.
type memCell struct {
	impl   string
	limits int
	peer   bool
	setup  func(addr string) (decider, func(), error)
}

// memResult is what one memory cell measured.
type memResult struct {
	impl   string
	limits int
	peer   bool
	err    string
	// keysPerID is the server's keys over the identifiers.
	keysPerID float64
	// usedPerID is used_memory after the identifiers over before, per
	// identifier: what the server as a whole spent (dictionary slots and
	// expiry entries included).
	usedPerID float64
	// usagePerID is MEMORY USAGE averaged over sampled keys, times the keys
	// per identifier.
	usagePerID float64
}

// memCells lists the memory comparison: throttlekit with its defaults and
// ulule, one limit and the three of pathThree.
func memCells() []memCell {
	tk := func(spec string) func(addr string) (decider, func(), error) {
		return func(addr string) (decider, func(), error) {
			c := newRedisClient(addr)
			b, err := redisbackend.New(c)
			if err != nil {
				_ = c.Close()
				return nil, nil, err
			}
			d, err := throttlekit(b, spec)
			return d, func() { _ = c.Close() }, err
		}
	}
	ul := func(rates ...limiter.Rate) func(addr string) (decider, func(), error) {
		return func(addr string) (decider, func(), error) {
			c := newRedisClient(addr)
			d, err := ululeDecider(c, rates...)
			return d, func() { _ = c.Close() }, err
		}
	}
	return []memCell{
		{impl: implDefault, limits: 1, setup: tk(specOne)},
		{impl: implDefault, limits: 3, setup: tk(specThree)},
		{impl: implLayout2, limits: 1, setup: layout2(time.Minute)},
		{impl: implLayout2, limits: 3, setup: layout2(time.Second, time.Minute, time.Hour)},
		{impl: implUlule, limits: 1, peer: true, setup: ul(limiter.Rate{Period: time.Minute, Limit: defaultPerMin})},
		{impl: implUlule3, limits: 3, peer: true, setup: ul(ululeRates...)},
	}
}

// implLayout2 is the layout before issue 21, for the memory table only.
const implLayout2 = "throttlekit, layout 2 (before: one string per limit, written directly)"

// layout2 stands in for the layout before issue 21, which can no longer
// decide: for each identifier it writes what that layout's script wrote
// after one allowed decision of a fixed window, one string "used:end" per
// limit with its expiry, under the keys redisbackend.Layout2Keys names.
func layout2(windows ...time.Duration) func(addr string) (decider, func(), error) {
	return func(addr string) (decider, func(), error) {
		c := newRedisClient(addr)
		b, err := redisbackend.New(c)
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		var limits []driver.Limit
		for i, w := range windows {
			l, err := driver.NewLimit(fmt.Sprintf("l%d", i), driver.FixedWindow, 1000, w, 0)
			if err != nil {
				_ = c.Close()
				return nil, nil, err
			}
			limits = append(limits, l)
		}
		p, err := driver.NewPolicy("bench", limits...)
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		return func(ctx context.Context, id string) (bool, error) {
			now := time.Now()
			pipe := c.Pipeline()
			for i, key := range b.Layout2Keys(p, id) {
				w := windows[i]
				end := now.Truncate(w).Add(w)
				pipe.Set(ctx, key, fmt.Sprintf("1:%d", end.UnixMilli()), end.Sub(now)+time.Second)
			}
			_, err := pipe.Exec(ctx)
			return err == nil, err
		}, func() { _ = c.Close() }, nil
	}
}

// memSample is how many keys MEMORY USAGE reads per cell.
const memSample = 500

// runMemCell decides identifiers distinct identifiers once each, from 64
// goroutines, on the emptied standalone server, and reads what the server
// holds for them.
func runMemCell(ctx context.Context, env *env, identifiers int, m memCell) memResult {
	r := memResult{impl: m.impl, limits: m.limits, peer: m.peer}
	fail := func(err error) memResult { r.err = err.Error(); return r }
	addr := env.standalone
	admin := env.admin(addr)
	d, cleanup, err := m.setup(addr)
	if err != nil {
		return fail(err)
	}
	defer cleanup()
	// Warm-up on other identifiers, so that the connections and scripts
	// exist before the first reading; then empty the server.
	if err := decideAll(ctx, d, "warm:", 2000); err != nil {
		return fail(err)
	}
	if err := env.flush([]string{addr}); err != nil {
		return fail(err)
	}
	before, err := usedMemory(ctx, env, addr)
	if err != nil {
		return fail(err)
	}
	if err := decideAll(ctx, d, "user:", identifiers); err != nil {
		return fail(err)
	}
	after, err := usedMemory(ctx, env, addr)
	if err != nil {
		return fail(err)
	}
	keys, err := admin.DBSize(ctx).Result()
	if err != nil {
		return fail(err)
	}
	var sampled, bytes int64
	iter := admin.Scan(ctx, 0, "*", 100).Iterator()
	for sampled < memSample && iter.Next(ctx) {
		n, err := admin.MemoryUsage(ctx, iter.Val(), 0).Result()
		if err != nil {
			return fail(err)
		}
		sampled++
		bytes += n
	}
	if err := iter.Err(); err != nil {
		return fail(err)
	}
	if sampled == 0 {
		return fail(fmt.Errorf("no keys after %d identifiers", identifiers))
	}
	r.keysPerID = float64(keys) / float64(identifiers)
	r.usedPerID = float64(after-before) / float64(identifiers)
	r.usagePerID = float64(bytes) / float64(sampled) * r.keysPerID
	return r
}

// decideAll decides prefix+0 … prefix+(n-1) once each from 64 goroutines.
func decideAll(ctx context.Context, d decider, prefix string, n int) error {
	const goroutines = 64
	var wg sync.WaitGroup
	errs := make([]error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += goroutines {
				if _, err := d(ctx, prefix+strconv.Itoa(i)); err != nil && errs[g] == nil {
					errs[g] = err
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// usedMemory reads used_memory from INFO memory.
func usedMemory(ctx context.Context, env *env, addr string) (int64, error) {
	info, err := env.admin(addr).Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no used_memory in INFO memory from %s", addr)
}
