package config_test

import (
	"fmt"
	"log"

	"github.com/throttlekit/throttlekit/middleware/rls/config"
)

func Example() {
	cfg, err := config.Parse([]config.File{{Name: "messaging.yaml", Data: []byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
      limits: ["10/min gcra"]   # throttlekit: also at most 10 a minute, smoothly
`)}})
	if err != nil {
		log.Fatal(err) // an *config.Error: file, line, column and what is wrong
	}
	for _, entries := range [][]config.Entry{
		{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: "2061111111"}},
		{{Key: "to_number", Value: "2061111111"}},
		{{Key: "message_type", Value: "marketing"}},
	} {
		m := cfg.Lookup("messaging", entries)
		if m.Rule == nil {
			fmt.Println("no limit")
			continue
		}
		fmt.Printf("%s\n  counter %s\n", m.Rule.Policy, m.CacheKey)
	}
	// Output:
	// messaging.message_type_marketing.to_number: 5/day aligned
	//   counter messaging_message_type_marketing_to_number_2061111111
	// messaging.to_number: 100/day aligned, 10/min gcra
	//   counter messaging_to_number_2061111111
	// no limit
}
