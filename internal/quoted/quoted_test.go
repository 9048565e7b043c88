package quoted

import (
	"reflect"
	"testing"
)

func TestSplit(t *testing.T) {
	for _, c := range []struct {
		in     string
		parts  []string
		closed bool
	}{
		{"a,b", []string{"a", "b"}, true},
		{"", []string{""}, true},
		{`a,"b,c",d`, []string{"a", `"b,c"`, "d"}, true},
		{`"a\",b",c`, []string{`"a\",b"`, "c"}, true},
		{`a,"b,c`, []string{"a", `"b,c`}, false},
		{"a,,b,", []string{"a", "", "b", ""}, true},
	} {
		parts, closed := Split(c.in, Byte(','))
		if !reflect.DeepEqual(parts, c.parts) || closed != c.closed {
			t.Errorf("Split(%q) = %q, %v; want %q, %v", c.in, parts, closed, c.parts, c.closed)
		}
	}
}
