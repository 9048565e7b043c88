package localserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"
)

// This file starts an Unleash server (the unleash-server npm package on
// Node.js) with the PostgreSQL database it needs, for tests of the Unleash
// flag source against the real thing.

// UnleashServerVersion is the unleash-server npm package version the
// helpers run (the newest that supports Node.js 20).
const UnleashServerVersion = "7.5.1"

// Tokens the Unleash server is started with: an admin token for the admin
// API (creating and changing toggles) and a client token for the
// development environment, which is what a flag source uses.
const (
	UnleashAdminToken  = "*:*.throttlekit-admin-token"
	UnleashClientToken = "default:development.throttlekit-client-token"
)

// UnleashDir returns the directory where the unleash-server package is
// installed (its node_modules beside it): $THROTTLEKIT_UNLEASH_DIR, or
// unleash-server-<version> under the user's cache directory
// (~/.cache/throttlekit). scripts/install-unleash.sh (make unleash) installs it there.
func UnleashDir() string {
	if d := os.Getenv("THROTTLEKIT_UNLEASH_DIR"); d != "" {
		return d
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	return filepath.Join(cache, "throttlekit", "unleash-server-"+UnleashServerVersion)
}

// postgresBinDir finds PostgreSQL's server programs: $PG_BIN, or the
// newest /usr/lib/postgresql/<version>/bin that holds initdb (Debian keeps
// them off PATH).
func postgresBinDir() (string, error) {
	if d := os.Getenv("PG_BIN"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("%w: PostgreSQL's initdb (set $PG_BIN, or install postgresql)", ErrBinaryNotFound)
}

// account is a user the child processes run as.
type account struct{ uid, gid uint32 }

// postgresAccount is the account PostgreSQL runs as: the "postgres" user
// when this process is root (PostgreSQL refuses root), nil otherwise.
func postgresAccount() (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: running as root needs a postgres user for PostgreSQL: %v", ErrBinaryNotFound, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("localserver: postgres user: %w", err)
	}
	return &account{uid: uint32(uid), gid: uint32(gid)}, nil
}

// Unleash is an Unleash server and its PostgreSQL database, each on a
// loopback port. It is safe for concurrent use.
type Unleash struct {
	dir       string
	pgPort    int
	port      int
	postgres  *process
	node      *process
	closeOnce sync.Once
	closeErr  error
}

// unleashEntry is the program Node.js runs: it loads the installed
// unleash-server package and starts it on the given ports with the
// tokens above. Arguments: the package directory, the PostgreSQL port, the
// Unleash port, the admin token, the client token.
const unleashEntry = `const [dir, pgPort, port, admin, client] = process.argv.slice(2);
const mod = await import(dir + '/node_modules/unleash-server/dist/lib/server-impl.js');
const unleash = mod.default ?? mod;
await unleash.start({
  db: { host: '127.0.0.1', port: Number(pgPort), user: 'postgres', password: '', database: 'unleash', ssl: false },
  server: { host: '127.0.0.1', port: Number(port) },
  logLevel: 'warn',
  authentication: {
    initApiTokens: [
      { environment: '*', project: '*', secret: admin, type: 'admin', tokenName: 'throttlekit-admin' },
      { environment: 'development', project: 'default', secret: client, type: 'client', tokenName: 'throttlekit-client' },
    ],
  },
});
console.log('unleash started');
`

// StartUnleash starts PostgreSQL (a fresh cluster in a temporary
// directory, as the postgres user when running as root) and Unleash on
// free loopback ports, and waits until Unleash reports healthy. The error
// wraps [ErrBinaryNotFound] when node, PostgreSQL or the unleash-server
// package (see [UnleashDir]) is missing.
func StartUnleash() (*Unleash, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("%w: node: %v", ErrBinaryNotFound, err)
	}
	modules := UnleashDir()
	if _, err := os.Stat(filepath.Join(modules, "node_modules", "unleash-server", "package.json")); err != nil {
		return nil, fmt.Errorf("%w: unleash-server %s in %s (run scripts/install-unleash.sh)", ErrBinaryNotFound, UnleashServerVersion, modules)
	}
	pgBin, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	pgUser, err := postgresAccount()
	if err != nil {
		return nil, err
	}
	u := &Unleash{}
	if u.dir, err = os.MkdirTemp("", "localserver-unleash-"); err != nil {
		return nil, fmt.Errorf("localserver: unleash directory: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = u.Close()
		}
	}()
	if pgUser != nil {
		if err := os.Chown(u.dir, int(pgUser.uid), int(pgUser.gid)); err != nil {
			return nil, fmt.Errorf("localserver: unleash directory: %w", err)
		}
	}
	data := filepath.Join(u.dir, "pgdata")
	if err := runAs(pgUser, u.dir, filepath.Join(pgBin, "initdb"), "-D", data, "--auth=trust", "-U", "postgres",
		"-E", "UTF8", "--no-sync"); err != nil {
		return nil, err
	}
	if u.pgPort, err = reservePort(false); err != nil {
		return nil, err
	}
	pgAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(u.pgPort))
	u.postgres = &process{
		name: "postgres", path: filepath.Join(pgBin, "postgres"), dir: u.dir, addr: pgAddr, user: pgUser,
		args: []string{"-D", data, "-p", strconv.Itoa(u.pgPort), "-h", "127.0.0.1", "-k", u.dir,
			"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"},
		probe: func(ctx context.Context, addr string, pid int) error {
			return runAs(pgUser, u.dir, filepath.Join(pgBin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(u.pgPort))
		},
		startTimeout: 30 * time.Second,
		killOnClose:  true, // a throwaway database: nothing to save
	}
	if err := u.postgres.start(); err != nil {
		return nil, err
	}
	if err := runAs(pgUser, u.dir, filepath.Join(pgBin, "createdb"), "-h", "127.0.0.1", "-p", strconv.Itoa(u.pgPort),
		"-U", "postgres", "unleash"); err != nil {
		return nil, err
	}
	entry := filepath.Join(u.dir, "start.mjs")
	if err := os.WriteFile(entry, []byte(unleashEntry), 0o644); err != nil {
		return nil, fmt.Errorf("localserver: unleash entry: %w", err)
	}
	if u.port, err = reservePort(false); err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(u.port))
	u.node = &process{
		name: "unleash-server", path: node, dir: u.dir, addr: addr,
		args:         []string{entry, modules, strconv.Itoa(u.pgPort), strconv.Itoa(u.port), UnleashAdminToken, UnleashClientToken},
		probe:        unleashProbe,
		startTimeout: 60 * time.Second, // the first start runs the schema migrations
		killOnClose:  true,
	}
	if err := u.node.start(); err != nil {
		return nil, err
	}
	ok = true
	return u, nil
}

// unleashProbe checks that Unleash at addr reports itself healthy.
func unleashProbe(ctx context.Context, addr string, pid int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health answered %s", resp.Status)
	}
	return nil
}

// runAs runs a program to completion as u (nil: this process's user) in
// dir, and returns its output in the error when it fails.
func runAs(u *account, dir, path string, args ...string) error {
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	if u != nil {
		setUser(cmd, u)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("localserver: %s: %w: %s", filepath.Base(path), err, tail(out))
	}
	return nil
}

// tail returns the end of out, for error messages.
func tail(out []byte) string {
	if len(out) > logTailBytes {
		out = out[len(out)-logTailBytes:]
	}
	return string(out)
}

// URL returns Unleash's base address, "http://127.0.0.1:port".
func (u *Unleash) URL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(u.port))
}

// APIURL returns the URL a client is given: the base address and /api/.
func (u *Unleash) APIURL() string { return u.URL() + "/api/" }

// Stop stops the Unleash server (PostgreSQL keeps running), keeping its
// port, so Start can bring it back on the same address.
func (u *Unleash) Stop() error { return u.node.stop() }

// Start restarts a stopped Unleash server and waits until it is healthy.
func (u *Unleash) Start() error { return u.node.start() }

// Close stops Unleash and PostgreSQL, releases their ports and removes the
// directory. It is idempotent.
func (u *Unleash) Close() error {
	u.closeOnce.Do(func() {
		var errs []error
		for _, p := range []*process{u.node, u.postgres} {
			if p != nil {
				errs = append(errs, p.close())
			}
		}
		for _, port := range []int{u.port, u.pgPort} {
			if port != 0 {
				releasePort(port, false)
			}
		}
		errs = append(errs, os.RemoveAll(u.dir))
		u.closeErr = errors.Join(errs...)
	})
	return u.closeErr
}
