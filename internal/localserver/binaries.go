package localserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// Names of the binaries this package runs, as accepted by [LookPath] and
// [Available].
const (
	// RedisServerBinary is the Redis server; override with $REDIS_SERVER.
	RedisServerBinary = "redis-server"
	// RedisCLIBinary is the Redis command-line client, used to create
	// clusters; override with $REDIS_CLI.
	RedisCLIBinary = "redis-cli"
	// MemcachedBinary is the memcached server; override with $MEMCACHED.
	MemcachedBinary = "memcached"
)

// ErrBinaryNotFound is returned (wrapped) when a server binary cannot be
// found. Match it with errors.Is.
var ErrBinaryNotFound = errors.New("localserver: binary not found")

// ErrClosed is returned (wrapped) by Start when the server was already
// closed.
var ErrClosed = errors.New("localserver: server closed")

// ErrInvalidArgument is returned (wrapped) when a Start function is called
// with arguments it cannot use, such as a nil primary or a master name that
// cannot be written to a Sentinel configuration file.
var ErrInvalidArgument = errors.New("localserver: invalid argument")

// envOverride maps a binary name to the environment variable that may name a
// replacement.
var envOverride = map[string]string{
	RedisServerBinary: "REDIS_SERVER",
	RedisCLIBinary:    "REDIS_CLI",
	MemcachedBinary:   "MEMCACHED",
}

// LookPath resolves one of [RedisServerBinary], [RedisCLIBinary] or
// [MemcachedBinary] to an executable path, honouring the REDIS_SERVER,
// REDIS_CLI and MEMCACHED environment overrides. Other names are looked up in
// PATH as is. The error wraps [ErrBinaryNotFound].
func LookPath(binary string) (string, error) {
	name, source := binary, "PATH"
	if env, ok := envOverride[binary]; ok {
		if v := os.Getenv(env); v != "" {
			name, source = v, "$"+env
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: %s (looked up %q via %s): %v", ErrBinaryNotFound, binary, name, source, err)
	}
	return p, nil
}

// Available reports whether binary (see [LookPath]) can be found.
func Available(binary string) bool {
	_, err := LookPath(binary)
	return err == nil
}
