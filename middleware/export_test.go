package middleware

// The header arithmetic, for the external tests.
var (
	CeilUnix    = ceilUnix
	CeilSeconds = ceilSeconds
)
