package localserver

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// clusterCreateTimeout bounds `redis-cli --cluster create`.
	clusterCreateTimeout = 60 * time.Second
	// clusterReadyTimeout bounds the wait for every node to agree on a
	// healthy, fully assigned cluster after creation.
	clusterReadyTimeout = 30 * time.Second
	// clusterSlots is the number of hash slots in a Redis Cluster.
	clusterSlots = 16384
)

// RedisCluster is a Redis Cluster made of redis-server processes on
// loopback ports. It is safe for concurrent use.
type RedisCluster struct {
	nodes     []*Redis
	primaries int
	replicas  int

	closeOnce sync.Once
	closeErr  error
}

// StartRedisCluster starts primaries*(1+replicasPerPrimary) redis-server
// nodes with cluster mode enabled (cluster-node-timeout 5000 ms), joins them
// with `redis-cli --cluster create ... --cluster-replicas replicasPerPrimary
// --cluster-yes`, and waits until every node reports cluster_state:ok, all
// 16384 slots assigned, the full node list, and every replica linked and
// synced to its primary. primaries must be at least 3 (a redis-cli
// requirement) and replicasPerPrimary at least 0, or the error wraps
// [ErrInvalidArgument]. The error wraps [ErrBinaryNotFound] when redis-server or
// redis-cli cannot be found.
func StartRedisCluster(primaries, replicasPerPrimary int) (*RedisCluster, error) {
	if primaries < 3 {
		return nil, fmt.Errorf("%w: a Redis Cluster needs at least 3 primaries, got %d", ErrInvalidArgument, primaries)
	}
	if replicasPerPrimary < 0 {
		return nil, fmt.Errorf("%w: negative replicas per primary: %d", ErrInvalidArgument, replicasPerPrimary)
	}
	if _, err := LookPath(RedisServerBinary); err != nil {
		return nil, err
	}
	cli, err := LookPath(RedisCLIBinary)
	if err != nil {
		return nil, err
	}
	c := &RedisCluster{primaries: primaries, replicas: replicasPerPrimary}
	n := primaries * (1 + replicasPerPrimary)
	for range n {
		node, err := startRedis(RedisOptions{}, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", // relative to --dir
			"--cluster-node-timeout", "5000",
		}, true)
		if err != nil {
			return nil, errors.Join(err, c.Close())
		}
		c.nodes = append(c.nodes, node)
	}
	if err := c.create(cli); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if err := c.WaitReady(clusterReadyTimeout); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// create runs redis-cli --cluster create over all nodes.
func (c *RedisCluster) create(cli string) error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(c.replicas), "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.WaitDelay = 2 * time.Second
	setProcAttr(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timeout %v)", err, clusterCreateTimeout)
		}
		return fmt.Errorf("localserver: redis-cli --cluster create: %v\n--- redis-cli output ---\n%s", err, tailString(string(out), logTailBytes))
	}
	return nil
}

// WaitReady waits until every node (all must be running) reports
// cluster_state:ok, all
// slots assigned and ok, and sees the full topology (the configured number of
// primaries and replicas, none failing or in handshake), and every replica
// has its link to its primary up with no sync in progress. StartRedisCluster
// calls it; tests can call it again after stopping and restarting nodes.
func (c *RedisCluster) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.checkReady(deadline)
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("localserver: redis cluster not ready after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkReady makes one pass of WaitReady's checks over all nodes.
func (c *RedisCluster) checkReady(deadline time.Time) error {
	n := len(c.nodes)
	wantReplicas := c.primaries * c.replicas
	for _, node := range c.nodes {
		addr := node.Addr()
		info, err := redisInfo(addr, cmdTimeout(deadline), "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", addr, err)
		}
		for k, want := range map[string]string{
			"cluster_state":          "ok",
			"cluster_slots_assigned": strconv.Itoa(clusterSlots),
			"cluster_slots_ok":       strconv.Itoa(clusterSlots),
			"cluster_known_nodes":    strconv.Itoa(n),
			"cluster_size":           strconv.Itoa(c.primaries),
		} {
			if got := info[k]; got != want {
				return fmt.Errorf("%s: %s is %q, want %q", addr, k, got, want)
			}
		}
		nodes, err := redisString(addr, cmdTimeout(deadline), "CLUSTER", "NODES")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER NODES: %w", addr, err)
		}
		var masters, slaves int
		for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 {
				continue
			}
			for _, flag := range strings.Split(f[2], ",") {
				switch flag {
				case "master":
					masters++
				case "slave":
					slaves++
				case "fail", "fail?", "handshake", "noaddr":
					return fmt.Errorf("%s: CLUSTER NODES has node with flags %s", addr, f[2])
				}
			}
		}
		if masters != c.primaries || slaves != wantReplicas {
			return fmt.Errorf("%s: sees %d primaries and %d replicas, want %d and %d", addr, masters, slaves, c.primaries, wantReplicas)
		}
		repl, err := redisInfo(addr, cmdTimeout(deadline), "INFO", "replication")
		if err != nil {
			return fmt.Errorf("%s: INFO replication: %w", addr, err)
		}
		switch repl["role"] {
		case "master":
			if got := repl["connected_slaves"]; got != strconv.Itoa(c.replicas) {
				return fmt.Errorf("%s: primary has %s connected replicas, want %d", addr, got, c.replicas)
			}
		case "slave":
			if repl["master_link_status"] != "up" || repl["master_sync_in_progress"] != "0" {
				return fmt.Errorf("%s: replica link %q, sync in progress %q", addr, repl["master_link_status"], repl["master_sync_in_progress"])
			}
		default:
			return fmt.Errorf("%s: unexpected role %q", addr, repl["role"])
		}
	}
	return nil
}

// WaitReplicasSynced waits until every replica in the cluster has caught up
// with its primary (see [Redis.WaitReplicaSynced]), so that writes made
// before the call are readable on replicas.
func (c *RedisCluster) WaitReplicasSynced(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, node := range c.nodes {
		info, err := redisInfo(node.Addr(), cmdTimeout(deadline), "INFO", "replication")
		if err != nil {
			return fmt.Errorf("localserver: %s: INFO replication: %w", node.Addr(), err)
		}
		if info["role"] != "slave" {
			continue
		}
		if err := node.WaitReplicaSynced(time.Until(deadline)); err != nil {
			return err
		}
	}
	return nil
}

// Addrs returns the addresses of all nodes, primaries and replicas, in the
// order they were passed to redis-cli. Which nodes are primaries is up to
// redis-cli (and later failovers); ask the nodes (INFO replication or CLUSTER
// NODES) when it matters.
func (c *RedisCluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the cluster's nodes, in the same order as Addrs. Tests may
// Stop and Start individual nodes; closing them is left to Close.
func (c *RedisCluster) Nodes() []*Redis {
	return append([]*Redis(nil), c.nodes...)
}

// Close stops all nodes and removes their directories. It is idempotent:
// later calls return the first call's result.
func (c *RedisCluster) Close() error {
	c.closeOnce.Do(func() {
		errs := make([]error, len(c.nodes))
		var wg sync.WaitGroup
		for i, n := range c.nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = n.Close()
			}()
		}
		wg.Wait()
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// tailString returns at most the last n bytes of s.
func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
