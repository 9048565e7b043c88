package redisbackend

import "github.com/throttlekit/throttlekit/throttler/driver"

// ShapesLen is the number of shapes with scripts of their own.
func ShapesLen() int {
	if m := shapes.Load(); m != nil {
		return len(*m)
	}
	return 0
}

// IsShaped reports whether p decides with a script of its shape.
func IsShaped(p *driver.Policy) bool { return decideScriptFor(p) != decideScript }

// ResetShapes forgets every shape's scripts, so that a test that wants
// shape scripts for its policies is not left with the generic ones by the
// shapes earlier tests filled the cache with (maxShapes).
func ResetShapes() {
	shapesMu.Lock()
	defer shapesMu.Unlock()
	shapes.Store(nil)
}
