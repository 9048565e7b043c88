// Command per-user-redis is the common path: an HTTP API limited per
// signed-in user on Redis, with anonymous requests limited by client IP
// under a policy of their own. A per-user rule alone would let every
// request without a user through, unlimited and without headers; the last
// lines show that. REDIS_ADDR names the server.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
)

// userKey is where authenticate leaves the signed-in user.
type userKey struct{}

// authenticate stands for the application's own authentication, run
// before the limiter: it puts the bearer token's user in the context.
func authenticate(next http.Handler) http.Handler {
	tokens := map[string]string{"t-alice": "alice"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if user, known := tokens[token]; ok && known {
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, user))
		}
		next.ServeHTTP(w, r)
	})
}

func main() {
	client := redis.NewClient(&redis.Options{
		Addr:                  cmp.Or(os.Getenv("REDIS_ADDR"), "127.0.0.1:6379"),
		ContextTimeoutEnabled: true, // commands end at the throttler's call deadline
	})
	defer client.Close()
	backend, err := redisbackend.New(client)
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(backend)
	if err != nil {
		log.Fatal(err)
	}
	users, err := throttler.ParsePolicy("users", "3/min, 5000/h")
	if err != nil {
		log.Fatal(err)
	}
	anonymous, err := throttler.ParsePolicy("anonymous", "2/min, 60/h")
	if err != nil {
		log.Fatal(err)
	}

	// Two rules, each under a policy of its own name, so that an IP
	// address and a user name never share a counter. Unless names the
	// client IP only when there is no user. Behind a load balancer, set
	// ClientIPOptions.TrustedProxies, or every client shares its address.
	user := middleware.ContextValue(userKey{})
	limiter, err := middleware.New(th, []middleware.Rule{
		{Policy: users, Identify: user},
		{Policy: anonymous, Identify: middleware.Unless(middleware.ClientIP(middleware.ClientIPOptions{}), user)},
	})
	if err != nil {
		log.Fatal(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := httptest.NewServer(authenticate(limiter.Handler(api)))
	defer srv.Close()

	call := func(url, label, token string) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			log.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("%s: %d resource=%q remaining=%q\n", label, resp.StatusCode,
			resp.Header.Get("X-RateLimit-Resource"), resp.Header.Get("X-RateLimit-Remaining"))
	}
	for range 4 {
		call(srv.URL, "alice", "t-alice")
	}
	for range 3 {
		call(srv.URL, "anonymous", "")
	}

	// The mistake to avoid: with the per-user rule alone, a request
	// without a user matches no rule and passes untouched, with no
	// headers, however many are sent.
	perUserOnly, err := middleware.New(th, []middleware.Rule{{Policy: users, Identify: user}})
	if err != nil {
		log.Fatal(err)
	}
	unguarded := httptest.NewServer(authenticate(perUserOnly.Handler(api)))
	defer unguarded.Close()
	for range 3 {
		call(unguarded.URL, "anonymous, per-user rule alone", "")
	}
}
