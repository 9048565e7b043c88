package redisbackend

import (
	_ "embed"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// A decision runs a script written for its policy's shape, the algorithms
// of its limits in order ("fixed", "fixed+aligned+gcra"): decide_shape.lua.tmpl
// rendered with each limit's code inline, so that Redis runs no loop over
// limits, builds no table per limit or request and calls no function per
// step, which the generic decide.lua and decide_many.lua (common.lua) pay
// on every decision. BenchmarkScriptBody compares the two. The generic
// scripts stay the reference: TestShapeScriptsMirrorGenericRaw runs both
// on the same random requests, and every other script (peek, refund, take,
// seed) is still generic.
//
// A shape has two scripts, the lone one (decide.lua's ARGV) and the batch
// one (decide_many.lua's), cached here by shape and in Redis by SHA1 like
// every other script. Past maxShapeLimits limits (Lua 5.1 allows a function
// 60 upvalues) or maxShapes shapes a policy decides with the generic
// scripts.
var (
	//go:embed decide_shape.lua.tmpl
	shapeSource   string
	shapeTemplate = template.Must(template.New("decide_shape.lua.tmpl").
			Funcs(template.FuncMap{"inc": func(k int) int { return k + 1 }}).Parse(shapeSource))

	// shapes maps a shape's name (appendShapeName) to its scripts. It is
	// copied on write, under shapesMu, so that a decision reads it with no
	// lock and no allocation.
	shapes   atomic.Pointer[map[string]*shapeScripts]
	shapesMu sync.Mutex
)

const (
	maxShapeLimits = 6
	maxShapes      = 64
)

// shapeScripts is one shape's pair of decision scripts.
type shapeScripts struct {
	lone, many *goredis.Script
}

// manyScripts maps each lone decision script to the batch script that
// decides the same shape: the generic decide.lua's is decide_many.lua.
var manyScripts sync.Map // *goredis.Script → *goredis.Script

func init() {
	manyScripts.Store(decideScript, decideManyScript)
}

// manyFor returns the batch script of lone, a decision script, or nil
// when lone is not one.
func manyFor(lone *goredis.Script) *goredis.Script {
	if m, ok := manyScripts.Load(lone); ok {
		return m.(*goredis.Script)
	}
	return nil
}

// decideScriptFor returns the lone decision script of p's shape, made on
// the first call, or the generic decide.lua past the bounds above.
func decideScriptFor(p *driver.Policy) *goredis.Script {
	if len(p.Limits) == 0 || len(p.Limits) > maxShapeLimits {
		return decideScript
	}
	var b [maxShapeLimits * 8]byte
	name := appendShapeName(b[:0], p)
	if m := shapes.Load(); m != nil {
		if s, ok := (*m)[string(name)]; ok { // no allocation: the compiler converts in place
			return s.lone
		}
		if len(*m) >= maxShapes {
			return decideScript // full: no lock on every decision of a shape left out
		}
	}
	shapesMu.Lock()
	defer shapesMu.Unlock()
	old := shapes.Load()
	if old != nil {
		if s, ok := (*old)[string(name)]; ok {
			return s.lone
		}
		if len(*old) >= maxShapes {
			return decideScript
		}
	}
	lone, err := renderShape(p, false)
	if err != nil {
		return decideScript
	}
	many, err := renderShape(p, true)
	if err != nil {
		return decideScript
	}
	s := &shapeScripts{lone: goredis.NewScript(lone), many: goredis.NewScript(many)}
	next := make(map[string]*shapeScripts, 1)
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	next[string(name)] = s
	manyScripts.Store(s.lone, s.many)
	shapes.Store(&next)
	return s.lone
}

// appendShapeName appends p's shape to dst: its limits' algorithms, joined
// with '+'.
func appendShapeName(dst []byte, p *driver.Policy) []byte {
	for i := range p.Limits {
		if i > 0 {
			dst = append(dst, '+')
		}
		dst = append(dst, p.Limits[i].Algorithm.String()...)
	}
	return dst
}

// shapeLimit is what decide_shape.lua.tmpl knows of one limit.
type shapeLimit struct {
	I                      int // 1-based
	Base                   int // its k-th value is ARGV[a + Base + k]
	Aligned, GCRA, Sliding bool
	HasUsed                bool // every algorithm but GCRA keeps Used
}

// At is the offset from a of the limit's k-th value (1 algorithm, 2 Max, 3
// window, 4 capacity, 5 emission interval, 6 key).
func (l shapeLimit) At(k int) int { return l.Base + k }

// shapeField is one field of the HMGET: the local that holds it, its place
// in the reply, and the Lua expression of its name.
type shapeField struct {
	Var, Name string
	J         int
}

// renderShape writes the lone (many false) or batch script of p's shape.
// It fails only if the template is wrong, which every test would show;
// decideScriptFor then falls back to the generic scripts.
func renderShape(p *driver.Policy, many bool) (string, error) {
	data := struct {
		Name   string
		Many   bool
		Width  int
		Limits []shapeLimit
		Fields []shapeField
		// Held and Written are the reply's states, as read and as
		// written: append_states' fields of each limit.
		Held, Written []string
	}{Name: string(appendShapeName(nil, p)), Many: many, Width: 6 * len(p.Limits)}
	for i := range p.Limits {
		alg := p.Limits[i].Algorithm
		l := shapeLimit{I: i + 1, Base: 1 + 6*i, Aligned: alg == driver.AlignedWindow, GCRA: alg == driver.GCRA,
			Sliding: alg == driver.SlidingWindow, HasUsed: alg != driver.GCRA}
		data.Limits = append(data.Limits, l)
		add := func(v, name string) {
			data.Fields = append(data.Fields, shapeField{Var: fmt.Sprintf("%s%d", v, l.I), Name: fmt.Sprintf("%s%d", name, l.I), J: len(data.Fields) + 1})
		}
		add("e", "E")
		if l.HasUsed {
			add("u", "U")
			data.Held, data.Written = append(data.Held, fmt.Sprintf("u%d", l.I)), append(data.Written, fmt.Sprintf("nu%d", l.I))
		}
		data.Held, data.Written = append(data.Held, fmt.Sprintf("e%d", l.I)), append(data.Written, fmt.Sprintf("ne%d", l.I))
		if l.Sliding {
			add("p", "P")
			data.Held, data.Written = append(data.Held, fmt.Sprintf("p%d", l.I)), append(data.Written, fmt.Sprintf("np%d", l.I))
		}
	}
	data.Fields = append(data.Fields, shapeField{Var: "x", Name: "'x'", J: len(data.Fields) + 1})
	var out strings.Builder
	if err := shapeTemplate.Execute(&out, data); err != nil {
		return "", fmt.Errorf("throttlekit: redis: decide_shape.lua.tmpl: %w", err)
	}
	return out.String(), nil
}
