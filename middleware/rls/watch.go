package rls

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/throttlekit/throttlekit/middleware/rls/config"
)

// ReloadEvent reports one reload of a watched configuration directory.
type ReloadEvent struct {
	// Config is the configuration now in force: the new one, or, when Err
	// is set, the previous one, kept.
	Config *config.Config
	// Err is why the new files were refused (an *config.Error names the
	// file and line), or nil.
	Err error
}

// Watch loads dir's configuration into s whenever its files change, as
// envoy ratelimit reloads its runtime directory: a file written, added,
// removed or renamed in dir, or dir itself replaced by a symlink swap of
// its parent. Changes within settle (100 ms when 0) are loaded together.
// A configuration that does not load is refused: the one in force stays,
// the error is logged with its file and line, counted in the metrics, and
// sent on events when that is not nil (sends never block: a full channel
// drops the event). Watch returns when ctx is done, or at once with an
// error when dir cannot be watched.
func (s *Server) Watch(ctx context.Context, dir string, settle time.Duration, opts []config.Option, events chan<- ReloadEvent) error {
	if settle <= 0 {
		settle = 100 * time.Millisecond
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("throttlekit/rls: watching %s: %w", dir, err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("throttlekit/rls: watching %s: %w", dir, err)
	}
	// The parent too, so that a symlink swap of dir (or of a directory
	// above it, as goruntime's RUNTIME_ROOT swaps) is seen.
	parent := filepath.Dir(filepath.Clean(dir))
	_ = w.Add(parent)
	target, _ := filepath.EvalSymlinks(dir)

	reload := func() {
		cfg, err := config.LoadDir(dir, opts...)
		ev := ReloadEvent{}
		if err == nil {
			err = s.SetConfig(cfg)
		}
		if err != nil {
			if s.metrics != nil {
				s.metrics.ConfigLoadFailed()
			}
			s.o.log.Error("throttlekit/rls: configuration refused; the previous one stays in force", "dir", dir, "err", err)
			ev.Err = err
		} else {
			s.o.log.Info("throttlekit/rls: configuration loaded", "dir", dir, "domains", len(cfg.Domains()), "rules", len(cfg.Rules()))
		}
		ev.Config = s.Config()
		if events != nil {
			select {
			case events <- ev:
			default:
			}
		}
	}

	var timer *time.Timer
	var fire <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("throttlekit/rls: watcher closed")
			}
			if filepath.Dir(ev.Name) == parent && filepath.Clean(ev.Name) != filepath.Clean(dir) {
				// Something else beside dir changed; a swap shows as a
				// new target.
				if t, _ := filepath.EvalSymlinks(dir); t == target {
					continue
				}
			}
			if t, err := filepath.EvalSymlinks(dir); err == nil && t != target {
				target = t
				_ = w.Remove(dir)
				_ = w.Add(dir)
			}
			if timer == nil {
				timer = time.NewTimer(settle)
			} else {
				timer.Reset(settle)
			}
			fire = timer.C
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("throttlekit/rls: watcher closed")
			}
			s.o.log.Warn("throttlekit/rls: watching the configuration", "dir", dir, "err", err)
		case <-fire:
			fire = nil
			if _, err := os.Stat(dir); err != nil {
				s.o.log.Error("throttlekit/rls: configuration directory gone; the previous configuration stays in force", "dir", dir, "err", err)
				continue
			}
			reload()
		}
	}
}
