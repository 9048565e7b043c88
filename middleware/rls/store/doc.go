// Package store opens the throttlekit backend a rate limit service runs on
// from a one-line spec, as a service's settings name it:
//
//	memory                                          in process (one instance only)
//	redis://[user:pass@]host:port[/db]              Redis standalone (rediss:// for TLS)
//	redis+cluster://host:port,host:port             Redis Cluster, any nodes as seeds
//	redis+sentinel://[:pass@]host:port,host:port/MASTER   Redis through Sentinel
//	groups:a=redis://h:p?replica=redis://h:p,b=…    Redis groups (backend/redis/groups)
//	memcached://host:port,host:port                 memcached servers
//	envoy+redis://host:port[?prefix=P][&deciding=true]   envoy ratelimit's own counters
//	envoy+redis+cluster://…, envoy+redis+sentinel://…    the same on a Cluster, through Sentinel
//
// The envoy+ specs read the counters envoy ratelimit keeps in Redis, as the old side
// of a rollout (read-only), or, with deciding=true, counts in them as envoy
// ratelimit does while its processes still serve beside the service's.
//
// Rollout builds a rollout between two stores, by a static percentage or an
// Unleash toggle. Errors wrap ErrInvalidSpec and never hold a password.
package store
