package rollout

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStaticRolloutLinksNoUnleash lists the packages a program using the
// throttler, the memory backend and a rollout with a static source links:
// neither the Unleash client (its source lives in rollout/unleashflag) nor
// testify (which the Unleash client depends on) may be among them.
func TestStaticRolloutLinksNoUnleash(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(goTool, "list", "-deps", "./testdata/staticonly").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %d packages, too few to be real:\n%s", len(deps), out)
	}
	for _, d := range deps {
		for _, banned := range []string{"github.com/Unleash/", "github.com/stretchr/testify", "github.com/redis/", "github.com/bradfitz/gomemcache"} {
			if strings.HasPrefix(d, banned) {
				t.Errorf("the program links %s", d)
			}
		}
	}
}
