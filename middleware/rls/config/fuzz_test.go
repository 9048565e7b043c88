package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/throttlekit/throttlekit/middleware/rls/config"
)

// FuzzParse feeds Parse arbitrary files: it must never panic, every error
// must be an *Error wrapping ErrInvalidConfig, and every descriptor made of
// the input's own bytes must be looked up without trouble.
func FuzzParse(f *testing.F) {
	paths, err := filepath.Glob(filepath.Join("testdata", "envoy-readme", "*.yaml"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no seeds: %v", err)
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      algorithm: gcra\n      burst: 9\n      limits: [\"100/h sliding\"]\n      failure_mode: closed\n"))
	f.Add([]byte("domain: d\nname: &a {name: x}\nreplaces: [*a, *a]\ndescriptors: [{<<: {key: k}, rate_limit: {unlimited: yes}}]\n"))
	f.Add([]byte("domain: d\n---\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse([]config.File{{Name: "fuzz.yaml", Data: data}}, config.MergeDomains(true))
		if err != nil {
			var ce *config.Error
			if !errors.Is(err, config.ErrInvalidConfig) || !errors.As(err, &ce) || ce.File != "fuzz.yaml" {
				t.Fatalf("error %v (%T) is no *Error of fuzz.yaml wrapping ErrInvalidConfig", err, err)
			}
			return
		}
		for _, domain := range cfg.Domains() {
			for _, r := range cfg.Rules() {
				if r == nil || r.Blocks && r.Limits != nil || (r.Limits == nil) != (r.Policy == nil) {
					t.Fatalf("inconsistent rule %+v", r)
				}
			}
			s := string(data)
			for n := 1; n <= 3 && len(s) >= 2*n; n++ {
				var entries []config.Entry
				for i := 0; i < n; i++ {
					entries = append(entries, config.Entry{Key: s[i : i+1], Value: s[len(s)-i-1:]})
				}
				if m := cfg.Lookup(domain, entries); m.Rule == nil && m != (config.Match{}) {
					t.Fatalf("match without a rule: %+v", m)
				}
			}
		}
	})
}
