// Command partner-quota runs a fleet of workers that call a partner API
// under its published quotas, shared through one Redis: 300 calls a minute,
// 15,750 an hour, 300,000 a day, 1,500,000 a week and 6,000,000 in 30 days.
// Each worker takes a batch of work with AllowUpTo, which grants as many
// calls as every window allows at once, and when nothing is left waits its
// turn with Wait instead of failing. At the end it prints the quota used in
// each window. REDIS_ADDR names the server.
//
//	go run ./examples/partner-quota -workers 8 -batch 50 -duration 5s
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// partnerQuota is the partner's published quota, one limit per window.
const partnerQuota = "300/min, 15750/h, 300000/day, 1500000/week, 6000000/30d"

// subject is the identifier every worker of the fleet shares: the quota is
// the partner's, not a worker's.
const subject = "partner:acme"

func main() {
	workers := flag.Int("workers", 8, "workers sharing the quota")
	batch := flag.Int64("batch", 50, "calls a worker takes at most at once")
	duration := flag.Duration("duration", 5*time.Second, "how long the workers run")
	flag.Parse()

	client := redis.NewClient(&redis.Options{
		Addr:                  cmp.Or(os.Getenv("REDIS_ADDR"), "127.0.0.1:6379"),
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	backend, err := redisbackend.New(client, redisbackend.WithPrefix(fmt.Sprintf("partner-demo-%d:", time.Now().UnixNano())))
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(backend, throttler.WithFailureMode(throttler.FailClosed))
	if err != nil {
		log.Fatal(err)
	}
	policy, err := throttler.ParsePolicy("partner", partnerQuota)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	fmt.Printf("%d workers, batches of up to %d calls, for %v, sharing %s through one Redis\n",
		*workers, *batch, *duration, partnerQuota)
	stats, err := run(ctx, th, policy, *workers, *batch, func(int64) {})
	if err != nil {
		log.Fatal(err)
	}
	if err := report(os.Stdout, th, policy, stats); err != nil {
		log.Fatal(err)
	}
}

// Stats counts what the workers were granted.
type Stats struct {
	// Batches and BatchUnits count the grants of AllowUpTo and their units.
	Batches, BatchUnits int64
	// Waits counts the calls a worker made after waiting its turn.
	Waits int64
	// Grants holds every allowed result, for checking.
	Grants []throttler.Result
}

// run starts workers that take calls from the shared quota until ctx ends:
// a batch of up to batch calls with AllowUpTo, and when nothing is left,
// one call after Wait. send stands for making the calls. It returns what
// was granted, or the first error other than the end of ctx.
func run(ctx context.Context, th *throttler.Throttler, p *throttler.Policy, workers int, batch int64, send func(int64)) (*Stats, error) {
	var (
		mu       sync.Mutex
		stats    Stats
		firstErr atomic.Pointer[error]
		wg       sync.WaitGroup
	)
	record := func(r throttler.Result, waited bool) {
		mu.Lock()
		defer mu.Unlock()
		stats.Grants = append(stats.Grants, r)
		if waited {
			stats.Waits++
		} else {
			stats.Batches++
			stats.BatchUnits += r.Granted
		}
	}
	fail := func(err error) {
		if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			firstErr.CompareAndSwap(nil, &err)
		}
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				r, err := th.AllowUpTo(ctx, p, subject, batch)
				if err != nil {
					fail(err)
					return
				}
				if r.Granted > 0 {
					record(r, false)
					send(r.Granted)
					continue
				}
				// Nothing left in some window: wait for one call, then
				// take batches again.
				r, err = th.Wait(ctx, p, subject)
				if err != nil {
					fail(err)
					return
				}
				record(r, true)
				send(1)
			}
		}()
	}
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		return &stats, *err
	}
	return &stats, nil
}

// report prints the quota used in each window, as the store holds it.
func report(w io.Writer, th *throttler.Throttler, p *throttler.Policy, stats *Stats) error {
	r, err := th.Peek(context.Background(), p, subject)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "granted: %d batches, %d calls; %d calls after waiting\n", stats.Batches, stats.BatchUnits, stats.Waits)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\tused\tlimit\tremaining\t")
	for _, l := range r.Limits() {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t\n", l.Name, l.Used, l.Limit, l.Remaining)
	}
	return tw.Flush()
}
