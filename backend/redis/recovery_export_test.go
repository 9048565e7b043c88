package redisbackend

// InstallPoolHygiene gives c the connection hook without a breaker, as New
// is to do for every client (see installBreakers): the idle connections are
// marked stale when a command fails on the network.
func InstallPoolHygiene(c Client) error { return installBreakers(c, nil) }
