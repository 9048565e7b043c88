package upgradetest

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// record is one decision as a client saw it; the probe of an earlier
// release prints the same fields as JSON.
type record struct {
	Proc      string `json:"proc"`
	ID        string `json:"id"`
	Allowed   bool   `json:"allowed"`
	Used      int64  `json:"used"`
	Remaining int64  `json:"remaining"`
	ResetAt   int64  `json:"resetAt"` // Unix ms
	At        int64  `json:"at"`      // Unix ms, the deciding process's clock
	Err       string `json:"err,omitempty"`
}

// verdict sums up the records of one scenario.
type verdict struct {
	Decisions int
	// ByProc counts the decisions of each process.
	ByProc map[string]int
	// Windows is the number of distinct (identifier, ResetAt) among the
	// results without error.
	Windows int
	// ResetChanges counts results whose ResetAt differs from the previous
	// result of the identifier while that one's window was still open.
	ResetChanges int
	// OverQuota counts the grants beyond the quota, per identifier and
	// window, summed over every process.
	OverQuota int64
	// OverQuotaWindows counts the windows that granted over quota.
	OverQuotaWindows int
	// Errors counts errors and degraded results.
	Errors   int
	Examples []string
}

func (v verdict) String() string {
	return fmt.Sprintf("%d decisions %v, %d windows, %d ResetAt changes, %d grants over quota (in %d windows), %d errors",
		v.Decisions, v.ByProc, v.Windows, v.ResetChanges, v.OverQuota, v.OverQuotaWindows, v.Errors)
}

// judge reads records of every process as clients would: ordered by the
// clock reading of each decision (one host, one clock).
func judge(recs []record, quota int64) verdict {
	v := verdict{ByProc: map[string]int{}}
	byID := map[string][]record{}
	for _, r := range recs {
		v.Decisions++
		v.ByProc[r.Proc]++
		if r.Err != "" {
			v.Errors++
			if len(v.Examples) < 5 {
				v.Examples = append(v.Examples, fmt.Sprintf("%s %s at %d: %s", r.Proc, r.ID, r.At, r.Err))
			}
			continue
		}
		byID[r.ID] = append(byID[r.ID], r)
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		rs := byID[id]
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].At < rs[j].At })
		granted := map[int64]int64{}
		for i, r := range rs {
			if r.Allowed {
				granted[r.ResetAt]++
			} else if _, ok := granted[r.ResetAt]; !ok {
				granted[r.ResetAt] = 0
			}
			if i == 0 {
				continue
			}
			prev := rs[i-1]
			if r.ResetAt != prev.ResetAt && r.At < prev.ResetAt {
				v.ResetChanges++
				if len(v.Examples) < 5 {
					v.Examples = append(v.Examples, fmt.Sprintf("%s: ResetAt %d (%s, used %d) then %d (%s at %d, used %d)",
						id, prev.ResetAt, prev.Proc, prev.Used, r.ResetAt, r.Proc, r.At, r.Used))
				}
			}
		}
		for reset, n := range granted {
			v.Windows++
			if n > quota {
				v.OverQuota += n - quota
				v.OverQuotaWindows++
				if len(v.Examples) < 5 {
					v.Examples = append(v.Examples, fmt.Sprintf("%s: %d grants in the window ending %d", id, n, reset))
				}
			}
		}
	}
	return v
}

// TestJudge pins what the verdict counts on a hand-made timeline.
func TestJudge(t *testing.T) {
	recs := []record{
		{Proc: "old", ID: "a", Allowed: true, ResetAt: 60_000, At: 0},
		{Proc: "new", ID: "a", Allowed: true, ResetAt: 60_000, At: 10},
		{Proc: "new", ID: "a", Allowed: false, ResetAt: 60_000, At: 20},
		{Proc: "old", ID: "b", Allowed: true, ResetAt: 60_000, At: 0},
		{Proc: "new", ID: "b", Allowed: true, ResetAt: 70_000, At: 10_000},  // restarted
		{Proc: "old", ID: "b", Allowed: true, ResetAt: 60_000, At: 11_000},  // and back
		{Proc: "new", ID: "b", Allowed: true, ResetAt: 130_000, At: 70_000}, // the next window: no change
		{Proc: "new", ID: "c", Allowed: true, ResetAt: 60_000, At: 0, Err: "degraded: timeout"},
	}
	v := judge(recs, 1)
	want := verdict{ByProc: map[string]int{"old": 3, "new": 5}, Decisions: 8, Windows: 4, ResetChanges: 2, OverQuota: 2, OverQuotaWindows: 2, Errors: 1}
	v.Examples = nil
	if v.String() != want.String() {
		t.Fatalf("judge = %v, want %v", v, want)
	}
}

// newProcess decides identifiers as the probe does, with the code of this
// tree, in the test process: one throttler over its backend.
type newProcess struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	recs   []record
}

// startNew starts deciding ids+"0" .. ids+(n-1) on b under the probe's
// policy until stop, paced as the probe paces them: identifier i every
// (1 + i mod spread) × every.
func startNew(proc string, b driver.Backend, ids string, n, spread int, every time.Duration) (*newProcess, error) {
	// A call timeout as wide as the probe's: a slow -race run must not
	// turn a decision into a degraded one.
	th, err := throttler.New(b, throttler.WithCallTimeout(5*time.Second))
	if err != nil {
		return nil, err
	}
	p, err := throttler.ParsePolicy(policyName, policyLimits)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	np := &newProcess{cancel: cancel, done: make(chan struct{})}
	const workers = 4
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
				np.mu.Lock()
				np.recs = append(np.recs, rec)
				np.mu.Unlock()
			}
		}()
	}
	go func() {
		defer close(np.done)
		defer wg.Wait()
		defer close(jobs)
		start := time.Now()
		step := every / time.Duration(n)
		// Bounded: at most two minutes of decisions.
		for k := 0; ctx.Err() == nil && time.Since(start) < 2*time.Minute; k++ {
			if i := k % n; (k/n)%(1+i%spread) != 0 {
				continue
			}
			if wait := time.Until(start.Add(time.Duration(k) * step)); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			jobs <- fmt.Sprintf("%s%d", ids, k%n)
		}
	}()
	return np, nil
}

// stop ends the loop, waits for the decisions in flight and returns every
// record.
func (p *newProcess) stop() []record {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]record(nil), p.recs...)
}
