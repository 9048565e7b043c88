// Package config reads the rate limit configuration of envoy ratelimit
// (github.com/envoyproxy/ratelimit) and finds the rule that applies to a
// request's descriptor, exactly as envoy ratelimit does, so that its files
// move to throttlekit's rate limit service unchanged. A few optional keys
// add what throttlekit can do beyond envoy's fixed windows.
//
//	cfg, err := config.LoadDir("/srv/runtime_data/current/config")
//	m := cfg.Lookup("messaging", []config.Entry{{Key: "to_number", Value: "2061111111"}})
//	if m.Rule != nil { /* limit m.CacheKey under m.Rule.Policy */ }
//
// # Files
//
// A file names one domain and a tree of descriptors; a descriptor has a
// key, an optional value, an optional rate_limit block and optional nested
// descriptors:
//
//	domain: messaging
//	descriptors:
//	  - key: message_type
//	    value: marketing
//	    descriptors:
//	      - key: to_number
//	        rate_limit:
//	          unit: day              # second, minute, hour, day, week, month (30 days) or year (365 days), any case
//	          requests_per_unit: 5   # 0 blocks every request
//
// A descriptor may also set shadow_mode, quota_mode, detailed_metric,
// value_to_metric and share_threshold; a rate_limit block may set
// unlimited, name and replaces. Parse reads files given in memory; LoadDir
// reads the *.yaml and *.yml files of a directory in name order, as envoy
// ratelimit reads its runtime directory. A domain may appear in one file
// only, unless MergeDomains is on.
//
// # Matching
//
// Lookup walks a domain's tree one descriptor entry at a time. At each
// level the entry's key_value is tried first, then the level's wildcard
// keys (a key or key_value ending in '*', which matches by prefix) in file
// order, then the key alone. The walk goes one level deeper only while the
// descriptor found has descriptors of its own, and a rule applies only if
// it sits where the last entry matched: a descriptor with more or fewer
// entries than the path to a rule does not get that rule.
//
// # Keys
//
// A Match carries the two keys envoy ratelimit derives from it. CacheKey
// names the counter: the domain, then "_key_value" for each entry, with a
// share_threshold wildcard (such as "files/*") in place of the values it
// covers, so that they share one counter. MetricKey names the statistics:
// the rule's FullKey in general, the request's values with
// detailed_metric, the values of value_to_metric descriptors, and the
// wildcard of share_threshold descriptors, reproducing envoy ratelimit's
// GetLimit in every case, including its quirks.
//
// # Additions
//
// These keys of a rate_limit block are throttlekit's; envoy ratelimit
// refuses them, and they are refused anywhere else:
//
//	rate_limit:
//	  unit: minute
//	  requests_per_unit: 100
//	  algorithm: gcra            # aligned (the default), fixed, gcra or sliding
//	  burst: 20                  # gcra only
//	  limits: ["10/s", "5000/h sliding"]   # extra limits, in throttler.ParseLimit's notation
//	  failure_mode: closed       # open or closed, when the store fails
//
// The unit's limit is an unnamed throttler.Per(requests_per_unit, unit)
// counted by the rule's algorithm (DefaultAlgorithm, AlignedWindow unless
// set, when the block names none): envoy's windows start at multiples of
// the unit since the epoch, and so do AlignedWindow's. Being unnamed, it
// keeps its stored window when requests_per_unit changes. Each entry of
// limits means what throttler.ParseLimit reads from it alone, algorithm
// included (a fixed window when it names none). The rule's limits are
// decided together, all or nothing, as a throttler.Policy named after the
// rule's FullKey. With limits, unit and requests_per_unit may be left out;
// requests_per_unit 0 cannot be combined with them. Two limits of one
// window and algorithm in a rule are an error. An unlimited rule takes
// none of these keys.
//
// # Errors
//
// Every error about a file's contents is an *Error giving the file and,
// where known, the line and column, and wraps ErrInvalidConfig; Parse
// never panics. Refused, as
// envoy ratelimit refuses them: YAML syntax errors, unknown keys, keys
// that are no strings, descriptors or replaces entries that are no
// mappings, floating-point numbers, values of the wrong type, an empty domain or descriptor key, one composite key
// twice at a level, an invalid unit, a unit beside unlimited, an empty
// replaces name or one naming its own rule, share_threshold on a value
// that is no wildcard, and a domain in two files without MergeDomains.
// Refused as well: a file over 4 MiB, descriptors nested deeper than 32
// levels, more than 2^22 YAML nodes once aliases are expanded, and bad
// values of throttlekit's keys.
//
// # Differences from envoy ratelimit
//
// Booleans, numbers and strings are read as envoy ratelimit's YAML parser
// reads them (yes and on are true, 0x10 is 16). Keys envoy knows but that
// mean nothing where they stand (a unit beside a descriptor's key, say)
// are accepted and ignored, as there. Two things envoy accepts are
// refused: a key given twice in one mapping (envoy keeps the last one) and
// a second YAML document in a file (envoy reads the first only); both are
// almost always mistakes that change what a file means. A descriptor's own
// limit override (envoy's per-route limit) is left to the service: Lookup
// only reads the configuration.
package config
