package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// reporter shows a cleanup's progress on stderr while it runs: a progress
// bar on a terminal, a count line every second otherwise, or nothing.
type reporter struct {
	c    *cleaner
	mode string // "bar", "lines" or "none"
	bar  *progressbar.ProgressBar
	stop chan struct{}
	wg   sync.WaitGroup
}

// Update periods of the two displays.
const (
	barPeriod  = 100 * time.Millisecond
	linePeriod = time.Second
)

func newReporter(c *cleaner) *reporter {
	r := &reporter{c: c, mode: c.opts.progress, stop: make(chan struct{})}
	if r.mode == "auto" {
		r.mode = "lines"
		if isTerminal(c.a.stderr) {
			r.mode = "bar"
		}
	}
	if r.mode == "bar" {
		stderr := c.a.stderr
		r.bar = progressbar.NewOptions64(1,
			progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription(r.description()),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(stderr) }),
		)
	}
	return r
}

// description is the text before the bar.
func (r *reporter) description() string {
	s := &r.c.stats
	if r.c.opts.dryRun {
		return fmt.Sprintf("dry run %s*: %11s matched", r.c.opts.prefix, formatCount(s.matched.Load()))
	}
	return fmt.Sprintf("cleanup %s*: %11s deleted", r.c.opts.prefix, formatCount(s.deleted.Load()))
}

func (r *reporter) start() {
	if r.mode == "none" {
		return
	}
	period := barPeriod
	if r.mode == "lines" {
		period = linePeriod
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		last, lastAt := int64(0), time.Now()
		for {
			select {
			case <-r.stop:
				return
			case now := <-t.C:
				if r.mode == "bar" {
					r.updateBar(false)
					continue
				}
				n := r.c.stats.deleted.Load()
				if r.c.opts.dryRun {
					n = r.c.stats.matched.Load()
				}
				rate := float64(n-last) / now.Sub(lastAt).Seconds()
				last, lastAt = n, now
				r.line(rate)
			}
		}
	}()
}

// updateBar moves the bar to the part of the keyspace scanned. It stays
// short of the end until the run is complete: on a Cluster, a node that
// has not reported its size yet is not in the total.
func (r *reporter) updateBar(final bool) {
	s := &r.c.stats
	total := max(s.keyspace.Load(), 1)
	if r.bar.GetMax64() != total {
		r.bar.ChangeMax64(total)
	}
	done := s.scanned.Load()
	if !final {
		done = min(done, total-1)
	}
	// Both render (the bar is not throttled: the ticker paces it); Set64
	// only when the percentage moves, so it goes last, and the last frame
	// shows both figures fresh. At the end it fills the bar and ends the
	// line.
	r.bar.Describe(r.description())
	_ = r.bar.Set64(done)
}

func (r *reporter) line(rate float64) {
	s := &r.c.stats
	pct := 0.0
	if k := s.keyspace.Load(); k > 0 {
		pct = 100 * float64(s.scanned.Load()) / float64(k)
	}
	what := fmt.Sprintf("deleted %s", formatCount(s.deleted.Load()))
	if r.c.opts.dryRun {
		what = "dry run"
	}
	fmt.Fprintf(r.c.a.stderr, "cleanup %s*: scanned %.0f%% of %s keys, matched %s, %s (%s keys/s)\n",
		r.c.opts.prefix, pct, formatCount(s.keyspace.Load()), formatCount(s.matched.Load()), what,
		formatCount(int64(rate)))
}

// finish stops the display; complete says whether every node was scanned
// to the end, which fills the bar.
func (r *reporter) finish(complete bool) {
	if r.mode == "none" {
		return
	}
	close(r.stop)
	r.wg.Wait()
	if r.bar == nil {
		return
	}
	if complete {
		r.updateBar(true)
		_ = r.bar.Finish()
		return
	}
	r.updateBar(false)
	_ = r.bar.Exit()
}
