package store

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/Unleash/unleash-client-go/v4"
	"github.com/redis/go-redis/v9"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/rollout/unleashflag"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// ErrInvalidSpec is wrapped by every error about a store spec or rollout
// setting.
var ErrInvalidSpec = errors.New("throttlekit/rls/store: invalid store spec")

// Store is an opened backend and what closes it.
type Store struct {
	// Backend is the store, ready for throttler.New.
	Backend driver.Backend
	// Kind names the spec's scheme ("redis", "memcached", …).
	Kind    string
	closers []io.Closer
}

// Close closes the clients the store opened.
func (s *Store) Close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i].Close())
	}
	return errors.Join(errs...)
}

// specError returns an ErrInvalidSpec error naming the spec's scheme only,
// so that no password reaches a log.
func specError(spec string, format string, args ...any) error {
	scheme, _, _ := strings.Cut(spec, ":")
	return fmt.Errorf("%w: %s: %s", ErrInvalidSpec, scheme, fmt.Sprintf(format, args...))
}

// Open opens the store spec names; callTimeout bounds a memcached round trip
// (throttler.DefaultCallTimeout when 0).
func Open(spec string, callTimeout time.Duration) (*Store, error) {
	if callTimeout <= 0 {
		callTimeout = throttler.DefaultCallTimeout
	}
	switch {
	case spec == "memory":
		return &Store{Backend: memorybackend.New(), Kind: "memory"}, nil
	case strings.HasPrefix(spec, "redis"):
		c, kind, err := redisClient(spec)
		if err != nil {
			return nil, err
		}
		return redisStore(c, kind)
	case strings.HasPrefix(spec, "groups:"):
		b, err := redisgroups.Open(strings.TrimPrefix(spec, "groups:"))
		if err != nil {
			return nil, fmt.Errorf("%w: groups: %w", ErrInvalidSpec, err)
		}
		return &Store{Backend: b, Kind: "redis-groups", closers: []io.Closer{b}}, nil
	case strings.HasPrefix(spec, "memcached://"):
		addrs, _, _, _, err := hosts(spec, "memcached://")
		if err != nil {
			return nil, err
		}
		c, err := memcachedbackend.NewClient(callTimeout, addrs...)
		if err != nil {
			return nil, fmt.Errorf("%w: memcached: %w", ErrInvalidSpec, err)
		}
		b, err := memcachedbackend.New(c)
		if err != nil {
			return nil, fmt.Errorf("%w: memcached: %w", ErrInvalidSpec, err)
		}
		return &Store{Backend: b, Kind: "memcached", closers: []io.Closer{closerFunc(c.Close)}}, nil
	case strings.HasPrefix(spec, "envoy+redis"):
		// envoy ratelimit's own counters, on any kind of Redis: the spec
		// after "envoy+" is a Redis spec, less this store's two settings.
		redisSpec, query, _ := strings.Cut(strings.TrimPrefix(spec, "envoy+"), "?")
		q, err := url.ParseQuery(query)
		if err != nil {
			return nil, specError(spec, "malformed query")
		}
		prefix := q.Get("prefix")
		deciding := false
		if v := q.Get("deciding"); v != "" {
			if deciding, err = strconv.ParseBool(v); err != nil {
				return nil, specError(spec, "deciding=%q: want true or false", v)
			}
		}
		q.Del("prefix")
		q.Del("deciding")
		if len(q) > 0 {
			redisSpec += "?" + q.Encode()
		}
		c, _, err := redisClient(redisSpec)
		if err != nil {
			return nil, err
		}
		lopts := []legacybackend.Option{legacybackend.WithEnvoyPrefix(prefix)}
		if deciding {
			lopts = append(lopts, legacybackend.Deciding())
		}
		b, err := legacybackend.NewEnvoyRedis(c, lopts...)
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("%w: envoy+redis: %w", ErrInvalidSpec, err)
		}
		return &Store{Backend: b, Kind: "envoy-redis", closers: []io.Closer{c}}, nil
	}
	return nil, specError(spec, "unknown store; want memory, redis://, redis+cluster://, redis+sentinel://, groups:, memcached:// or envoy+redis://")
}

// redisClient opens the Redis client of a redis://, rediss://,
// redis+cluster:// or redis+sentinel:// spec, with ContextTimeoutEnabled
// so that commands end at the throttler's call deadline.
func redisClient(spec string) (redis.UniversalClient, string, error) {
	switch {
	case strings.HasPrefix(spec, "redis://"), strings.HasPrefix(spec, "rediss://"):
		opts, err := redis.ParseURL(spec)
		if err != nil {
			return nil, "", specError(spec, "%v", redact(err))
		}
		opts.ContextTimeoutEnabled = true
		return redis.NewClient(opts), "redis", nil
	case strings.HasPrefix(spec, "redis+cluster://"):
		addrs, user, pass, _, err := hosts(spec, "redis+cluster://")
		if err != nil {
			return nil, "", err
		}
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: user, Password: pass,
			ContextTimeoutEnabled: true}), "redis-cluster", nil
	case strings.HasPrefix(spec, "redis+sentinel://"):
		addrs, user, pass, master, err := hosts(spec, "redis+sentinel://")
		if err != nil {
			return nil, "", err
		}
		if master == "" {
			return nil, "", specError(spec, "no master name: redis+sentinel://host:port,host:port/MASTER")
		}
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: addrs,
			Username: user, Password: pass, ContextTimeoutEnabled: true}), "redis-sentinel", nil
	}
	return nil, "", specError(spec, "unknown Redis spec; want redis://, rediss://, redis+cluster:// or redis+sentinel://")
}

// redisStore puts the Redis backend over c.
func redisStore(c redis.UniversalClient, kind string) (*Store, error) {
	b, err := redisbackend.New(c)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidSpec, kind, err)
	}
	return &Store{Backend: b, Kind: kind, closers: []io.Closer{c}}, nil
}

// hosts reads "scheme://[user:pass@]h:p,h:p[/name]".
func hosts(spec, scheme string) (addrs []string, user, pass, name string, err error) {
	rest := strings.TrimPrefix(spec, scheme)
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		cred := rest[:at]
		rest = rest[at+1:]
		user, pass, _ = strings.Cut(cred, ":")
		if user, err = url.PathUnescape(user); err == nil {
			pass, err = url.PathUnescape(pass)
		}
		if err != nil {
			return nil, "", "", "", specError(spec, "malformed credentials")
		}
	}
	rest, name, _ = strings.Cut(rest, "/")
	for _, a := range strings.Split(rest, ",") {
		if a == "" {
			continue
		}
		if !strings.Contains(a, ":") {
			return nil, "", "", "", specError(spec, "address %q has no port", a)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return nil, "", "", "", specError(spec, "no address")
	}
	return addrs, user, pass, name, nil
}

// redact keeps an error's text from holding a password: url errors quote
// the whole URL.
func redact(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// RolloutSettings describe a rollout between two stores.
type RolloutSettings struct {
	// Old and New are store specs, as Open reads them.
	Old, New string
	// Mode is split (the default), mirror or shadow.
	Mode string
	// Percent is the static share of identifiers on New (0 to 100), used
	// when Unleash is nil.
	Percent int
	// Unleash, when set, takes the percentage from an Unleash toggle.
	Unleash *UnleashSettings
}

// UnleashSettings name an Unleash server and toggle.
type UnleashSettings struct {
	URL, App, Token, Toggle string
	// WaitForFirstFetch bounds how long opening waits for the server's
	// first answer (0: no wait; the rollout's default side serves until
	// then).
	WaitForFirstFetch time.Duration
	// RefreshInterval is how often the toggle is read again (the Unleash
	// client's default, 15 s, when 0).
	RefreshInterval time.Duration
}

// Rollout opens both stores and the rollout between them.
func Rollout(rs RolloutSettings, callTimeout time.Duration) (*Store, error) {
	mode := rollout.SplitMode
	switch rs.Mode {
	case "", "split":
	case "mirror":
		mode = rollout.MirrorMode
	case "shadow":
		mode = rollout.ShadowMode
	default:
		return nil, fmt.Errorf("%w: rollout mode %q: want split, mirror or shadow", ErrInvalidSpec, rs.Mode)
	}
	var src rollout.FlagSource
	var srcCloser io.Closer
	if rs.Unleash != nil {
		u := rs.Unleash
		if u.URL == "" || u.Toggle == "" {
			return nil, fmt.Errorf("%w: unleash needs url and toggle", ErrInvalidSpec)
		}
		app := u.App
		if app == "" {
			app = "throttlekit-rls"
		}
		opts := []unleashflag.Option{unleashflag.WithServer(u.URL, app)}
		if u.Token != "" {
			opts = append(opts, unleashflag.WithToken(u.Token))
		}
		if u.RefreshInterval > 0 {
			opts = append(opts, unleashflag.WithClientOptions(unleash.WithRefreshInterval(u.RefreshInterval)))
		}
		if u.WaitForFirstFetch > 0 {
			opts = append(opts, unleashflag.WithWaitForFirstFetch(u.WaitForFirstFetch))
		}
		s, err := unleashflag.New(u.Toggle, opts...)
		if err != nil {
			return nil, fmt.Errorf("%w: unleash: %w", ErrInvalidSpec, err)
		}
		src, srcCloser = s, s
	} else {
		s, err := rollout.NewStaticSource(rs.Percent)
		if err != nil {
			return nil, fmt.Errorf("%w: percent: %w", ErrInvalidSpec, err)
		}
		src = s
	}
	closeSrc := func() {
		if srcCloser != nil {
			_ = srcCloser.Close()
		}
	}
	oldStore, err := Open(rs.Old, callTimeout)
	if err != nil {
		closeSrc()
		return nil, fmt.Errorf("rollout old: %w", err)
	}
	newStore, err := Open(rs.New, callTimeout)
	if err != nil {
		closeSrc()
		_ = oldStore.Close()
		return nil, fmt.Errorf("rollout new: %w", err)
	}
	b, err := rollout.New(oldStore.Backend, newStore.Backend, src, rollout.WithMode(mode))
	if err != nil {
		closeSrc()
		_ = oldStore.Close()
		_ = newStore.Close()
		return nil, fmt.Errorf("%w: rollout: %w", ErrInvalidSpec, err)
	}
	st := &Store{Backend: b, Kind: "rollout", closers: []io.Closer{oldStore, newStore}}
	if srcCloser != nil {
		st.closers = append([]io.Closer{srcCloser}, st.closers...)
	}
	return st, nil
}
