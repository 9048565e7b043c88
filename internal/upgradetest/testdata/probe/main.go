// Command probe decides identifiers on a real store with the throttlekit
// release it is built in, and prints every result as a JSON line. The
// upgrade tests of internal/upgradetest copy it into the source tree of an
// earlier release (git archive of its commit), build it there with that
// release's own go.mod, and run it beside the code under test, so that the
// state they upgrade is written by the release itself, not by a copy of its
// scripts. It uses only API that every release since 7016ead has.
//
// It stops when its standard input closes or after -for, whichever is
// first, and prints nothing but results: one object per decision.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// record is one decision, as the tests read it.
type record struct {
	Proc      string `json:"proc"`
	ID        string `json:"id"`
	Allowed   bool   `json:"allowed"`
	Used      int64  `json:"used"`
	Remaining int64  `json:"remaining"`
	ResetAt   int64  `json:"resetAt"`
	At        int64  `json:"at"`
	Err       string `json:"err,omitempty"`
}

func main() {
	var (
		store   = flag.String("store", "redis", "redis, cluster, groups or memcached")
		addrs   = flag.String("addrs", "", "server addresses, comma-separated (groups: a redisgroups configuration)")
		prefix  = flag.String("ids", "u", "identifier prefix")
		n       = flag.Int("n", 100, "identifiers")
		policy  = flag.String("policy", "api", "policy name")
		limits  = flag.String("limits", "20/min", "the policy's limits")
		every   = flag.Duration("every", 400*time.Millisecond, "interval between two decisions of one identifier")
		spread  = flag.Int("spread", 1, "identifier i is decided every (1 + i mod spread) intervals")
		bound   = flag.Duration("for", time.Minute, "longest run")
		proc    = flag.String("proc", "old", "name printed in every record")
		workers = flag.Int("workers", 4, "decisions in flight at most")
		timeout = flag.Duration("timeout", 0, "per-call timeout (0: the release's default)")
	)
	flag.Parse()
	if err := run(*store, *addrs, *prefix, *n, *policy, *limits, *every, *bound, *spread, *proc, *workers, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func open(store, addrs string, timeout time.Duration) (driver.Backend, func(), error) {
	list := strings.Split(addrs, ",")
	switch store {
	case "redis":
		rdb := goredis.NewClient(&goredis.Options{Addr: list[0], ContextTimeoutEnabled: true})
		b, err := redisbackend.New(rdb)
		return b, func() { _ = rdb.Close() }, err
	case "cluster":
		rdb := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: list, ContextTimeoutEnabled: true})
		b, err := redisbackend.New(rdb)
		return b, func() { _ = rdb.Close() }, err
	case "groups":
		b, err := redisgroups.Open(addrs)
		if err != nil {
			return nil, nil, err
		}
		return b, func() { _ = b.Close() }, nil
	case "memcached":
		mc, err := memcachedbackend.NewClient(max(timeout, 100*time.Millisecond), list...)
		if err != nil {
			return nil, nil, err
		}
		b, err := memcachedbackend.New(mc)
		return b, func() {}, err
	}
	return nil, nil, fmt.Errorf("unknown store %q", store)
}

func run(store, addrs, prefix string, n int, name, limits string, every, bound time.Duration, spread int, proc string, workers int, timeout time.Duration) error {
	backend, closeFn, err := open(store, addrs, timeout)
	if err != nil {
		return err
	}
	defer closeFn()
	var opts []throttler.Option
	if timeout > 0 {
		opts = append(opts, throttler.WithCallTimeout(timeout))
	}
	th, err := throttler.New(backend, opts...)
	if err != nil {
		return err
	}
	// Connect before the first decision is due: a loaded machine may take
	// longer than a call's timeout to dial.
	pingCtx, stopPing := context.WithTimeout(context.Background(), 10*time.Second)
	for th.Ping(pingCtx) != nil && pingCtx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	stopPing()
	p, err := throttler.ParsePolicy(name, limits)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	go func() { // stop when the test closes our standard input
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	jobs := make(chan string, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range jobs {
				r, err := th.Allow(context.Background(), p, id)
				rec := record{Proc: proc, ID: id, Allowed: r.Allowed, Used: r.Used, Remaining: r.Remaining,
					ResetAt: r.ResetAt.UnixMilli(), At: r.At.UnixMilli()}
				switch {
				case err != nil:
					rec.Err = err.Error()
				case r.Degraded:
					rec.Err = fmt.Sprint("degraded: ", r.Err)
				}
				mu.Lock()
				_ = enc.Encode(rec)
				mu.Unlock()
			}
		}()
	}
	// Slot k is for identifier i = k mod n, due at start + k × every / n;
	// in round k / n, identifiers whose period the round is not a
	// multiple of sit out.
	start := time.Now()
	step := every / time.Duration(n)
	for k := 0; ctx.Err() == nil; k++ {
		if i := k % n; (k/n)%(1+i%max(spread, 1)) != 0 {
			continue
		}
		if wait := time.Until(start.Add(time.Duration(k) * step)); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		if ctx.Err() != nil {
			break
		}
		jobs <- fmt.Sprintf("%s%d", prefix, k%n)
	}
	close(jobs)
	wg.Wait()
	return out.Flush()
}
