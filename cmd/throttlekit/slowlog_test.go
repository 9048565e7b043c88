package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The slow log times commands by the wall clock. On a small shared
// machine a server that waits for a CPU, or a virtual machine that its
// host pauses, logs the wait as a slow command, whatever the command: on
// the two-core machine these tests were written on, a lone UNLINK of a
// small key was once logged at 83 ms. A slowlogWatch therefore records,
// while a cleanup runs, every stall it can see:
//
//   - each server's own wait for a CPU: the run_delay of its main thread
//     (/proc/PID/schedstat), sampled every millisecond, every rise being
//     a stall of that server (on a busy machine a server waits in many
//     short slices, each well under a slow entry, that add up to one);
//   - time the host took from this machine (steal in /proc/stat);
//   - wake-ups of its own sampling loop more than 5 ms late;
//   - in each server, a witness command of known small cost
//     (witnessScript, about 0.5 ms of Lua arithmetic touching no key) sent
//     every 4 ms.
//
// A slow-log entry of the cleanup is excused only when the stalls seen
// within a second of it (the slow log's resolution) account for all of it
// but 5 ms; it is then logged. Any other entry fails the test, and so does
// a command that is slow on average (INFO commandstats), which stalls
// here and there cannot make it.
var witnessScript = goredis.NewScript(`local x = 0 for i = 1, 20000 do x = x + i end return x`)

// stallSlack is how much of a slow entry a stall need not account for:
// more than any command of the cleanup costs on its own.
const stallSlack = 5 * time.Millisecond

type stall struct {
	at     time.Time
	length time.Duration
	server string // "" for the whole machine
	what   string
}

// slowlogWatch watches the slow logs of servers during a cleanup.
type slowlogWatch struct {
	servers []*goredis.Client
	pids    map[string]int
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	mu      sync.Mutex
	stalls  []stall
}

// watchSlowlogs makes each server log every command slower than 10 ms,
// empties its slow log and command statistics, and starts watching for
// stalls.
func watchSlowlogs(t *testing.T, servers ...*goredis.Client) *slowlogWatch {
	t.Helper()
	ctx := context.Background()
	w := &slowlogWatch{servers: servers, pids: map[string]int{}, stop: make(chan struct{})}
	for _, c := range servers {
		require.NoError(t, c.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err())
		require.NoError(t, c.ConfigSet(ctx, "slowlog-max-len", "1024").Err())
		require.NoError(t, c.Do(ctx, "SLOWLOG", "RESET").Err())
		require.NoError(t, c.ConfigResetStat(ctx).Err())
		info, err := c.Info(ctx, "server").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
				w.pids[c.Options().Addr], _ = strconv.Atoi(v)
			}
		}
	}
	for _, c := range servers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			tick := time.NewTicker(4 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-w.stop:
					return
				case <-tick.C:
					_ = witnessScript.Eval(ctx, c, nil).Err()
				}
			}
		}()
	}
	w.wg.Add(1)
	go w.sample()
	t.Cleanup(w.halt)
	return w
}

// sample records stalls every millisecond until halt.
func (w *slowlogWatch) sample() {
	defer w.wg.Done()
	delays := map[string]time.Duration{}
	for addr, pid := range w.pids {
		delays[addr] = runDelay(pid)
	}
	steal := stealTime()
	last := time.Now()
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		time.Sleep(time.Millisecond)
		now := time.Now()
		var found []stall
		if late := now.Sub(last) - time.Millisecond; late > stallSlack {
			found = append(found, stall{last, late, "", "sampling loop woke late"})
		}
		last = now
		for addr, pid := range w.pids {
			d := runDelay(pid)
			if jump := d - delays[addr]; jump > 0 {
				found = append(found, stall{now.Add(-jump), jump, addr, "server waited for a CPU"})
			}
			delays[addr] = d
		}
		if s := stealTime(); s > steal {
			found = append(found, stall{now.Add(-(s - steal)), s - steal, "", "host stole CPU time"})
			steal = s
		}
		if len(found) > 0 {
			w.mu.Lock()
			w.stalls = append(w.stalls, found...)
			w.mu.Unlock()
		}
	}
}

// runDelay returns the time the process's main thread has spent runnable
// but waiting for a CPU; 0 where /proc does not say.
func runDelay(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	ns, _ := strconv.ParseInt(f[1], 10, 64)
	return time.Duration(ns)
}

// stealTime returns the CPU time the host has taken from this machine, in
// all (clock ticks of 10 ms); 0 where /proc does not say.
func stealTime() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	ticks, _ := strconv.ParseInt(f[8], 10, 64)
	return time.Duration(ticks) * 10 * time.Millisecond
}

func (w *slowlogWatch) halt() {
	w.once.Do(func() { close(w.stop) })
	w.wg.Wait()
}

// explains reports whether the stalls seen on server addr (or
// machine-wide) within a second of at, a slow-log time in whole seconds,
// add up to at least d less stallSlack, and names the longest of them.
// A slow entry can be the sum of several stalls, and the slow log does not
// say when in its second a command ran.
func (w *slowlogWatch) explains(addr string, at time.Time, d time.Duration) (total time.Duration, longest stall, ok bool) {
	for _, s := range w.stalls {
		if (s.server == "" || s.server == addr) && !s.at.Before(at.Add(-time.Second)) && s.at.Before(at.Add(2*time.Second)) {
			total += s.length
			if s.length > longest.length {
				longest = s
			}
		}
	}
	return total, longest, total >= d-stallSlack
}

// check stops watching and requires that no command of the cleanup is in
// any slow log unless a stall explains it, and that the cleanup's
// commands average well under the threshold (INFO commandstats), which
// stalls here and there cannot hide.
func (w *slowlogWatch) check(t *testing.T) {
	t.Helper()
	w.halt()
	ctx := context.Background()
	var longest time.Duration
	long := 0
	for _, s := range w.stalls {
		longest = max(longest, s.length)
		if s.length > stallSlack {
			long++
		}
	}
	t.Logf("stalls over %v seen during the run: %d, the longest %v", stallSlack, long, longest)
	for _, c := range w.servers {
		addr := c.Options().Addr
		entries, err := c.SlowLogGet(ctx, -1).Result()
		require.NoError(t, err)
		for _, e := range entries {
			if len(e.Args) > 0 && strings.EqualFold(e.Args[0], "eval") {
				// A witness command: a stall of the server.
				w.stalls = append(w.stalls, stall{e.Time, e.Duration - time.Millisecond, addr, "witness command was slow"})
			}
		}
		var unexplained []string
		explained := 0
		for _, e := range entries {
			if len(e.Args) > 0 && strings.EqualFold(e.Args[0], "eval") {
				continue
			}
			desc := fmt.Sprintf("%v %v", e.Duration.Round(time.Microsecond), e.Args[:min(len(e.Args), 3)])
			if total, s, ok := w.explains(addr, e.Time, e.Duration); ok {
				explained++
				t.Logf("%s: slow log entry %s is stalls: %v in all around it, the longest %v (%s)",
					addr, desc, total.Round(time.Microsecond), s.length.Round(time.Microsecond), s.what)
			} else {
				unexplained = append(unexplained, desc)
			}
		}
		if explained == 0 && len(unexplained) == 0 {
			t.Logf("%s: no cleanup command in the slow log", addr)
		}
		assert.Empty(t, unexplained, "%s: cleanup commands over 10 ms that no stall explains", addr)
		stats, err := c.Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(stats, "\n") {
			for _, cmd := range []string{"scan", "evalsha"} {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":"); ok {
					per := commandStat(v, "usec_per_call")
					t.Logf("%s: %s %s", addr, cmd, v)
					assert.Less(t, per, 5000.0, "%s: %s takes %.0f µs per call on average", addr, cmd, per)
				}
			}
		}
	}
}

// commandStat reads one field of an INFO commandstats line.
func commandStat(line, field string) float64 {
	for _, kv := range strings.Split(line, ",") {
		if v, ok := strings.CutPrefix(kv, field+"="); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}
