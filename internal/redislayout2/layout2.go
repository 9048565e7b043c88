package redislayout2

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

var (
	//go:embed common.lua
	commonSource string
	//go:embed decide.lua
	decideSource string

	decideScript = func() *goredis.Script {
		shebang, body, _ := strings.Cut(decideSource, "\n")
		return goredis.NewScript(shebang + "\n" + commonSource + body)
	}()
)

// Writer decides on the layout-2 strings, as the release before layout 3
// did. It implements driver.Backend only.
type Writer struct {
	client  goredis.Scripter
	prefix  string
	graceMs int64
}

// New returns a Writer over client with the given key prefix and an
// expiry grace of 30 seconds, the default of that release.
func New(client goredis.Scripter, prefix string) *Writer {
	return &Writer{client: client, prefix: prefix, graceMs: 30_000}
}

// Keys returns the keys of identifier's state under p, one per limit.
func (w *Writer) Keys(p *driver.Policy, identifier string) []string {
	id := driver.EscapeKey(identifier)
	keys := make([]string, len(p.Limits))
	for i := range keys {
		keys[i] = w.prefix + "{" + id + "}:" + p.Key + ":" + p.Limits[i].Key
	}
	return keys
}

// Decide implements driver.Backend with one call of that release's
// decide.lua.
func (w *Writer) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	p := req.Policy
	args := []any{req.Now.UnixMilli(), req.Now.UnixMicro(), req.Cost, w.graceMs}
	for i := range p.Limits {
		l := &p.Limits[i]
		args = append(args, int64(l.Algorithm), l.Max, l.WindowMillis, l.Capacity, l.EmissionMicros)
	}
	reply, err := decideScript.Run(ctx, w.client, w.Keys(p, req.Identifier), args...).Slice()
	if err != nil {
		return driver.Outcome{}, err
	}
	if len(reply) != 1+3*len(p.Limits) {
		return driver.Outcome{}, fmt.Errorf("%w: %d elements", driver.ErrBadReply, len(reply))
	}
	ints := make([]int64, len(reply))
	for i, v := range reply {
		n, ok := v.(int64)
		if !ok {
			return driver.Outcome{}, fmt.Errorf("%w: element %d is %T", driver.ErrBadReply, i, v)
		}
		ints[i] = n
	}
	out := driver.Outcome{Allowed: ints[0] == 1, States: make([]driver.State, len(p.Limits))}
	for i := range out.States {
		out.States[i] = driver.State{Used: ints[1+3*i], End: ints[2+3*i], Prev: ints[3+3*i]}
	}
	return out, nil
}
