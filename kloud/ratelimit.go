package kloud

import (
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/kloud-dev/kloud/kite"
)

// Per-user rate limits (issue 19): every kloud method a user calls (rpc in routes.go; not
// kontrol's methods, not plugins' routes) takes a token from that user's bucket, which refills
// at Limits.RateLimit per second up to Limits.RateBurst. An empty bucket refuses the call with
// -32007 (rateLimited) saying when to retry; nothing of the call ran. The buckets live in memory
// (one kloud process), at most maxRateBuckets of them: a bucket that has refilled is the same as
// a new one and is dropped, and when none has, the fullest goes.

const (
	// DefaultRateLimit and DefaultRateBurst are kloud serve's --rate-limit and --rate-burst: far
	// above what a person or a script that waits for its answers makes, and a browser's page load.
	DefaultRateLimit = 20
	DefaultRateBurst = 100
	// maxRateBuckets bounds the users with a bucket in memory.
	maxRateBuckets = 10000
)

type rateBucket struct {
	lim *rate.Limiter
}

// rateLimiter is the token buckets of users. A nil *rateLimiter allows everything.
type rateLimiter struct {
	limit rate.Limit
	burst int
	max   int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*rateBucket
}

// newRateLimiter returns buckets of perSecond tokens a second up to burst, at most maxBuckets of them;
// nil (no limit) when perSecond is 0 or less.
func newRateLimiter(perSecond float64, burst, maxBuckets int) *rateLimiter {
	if perSecond <= 0 {
		return nil
	}
	if burst < 1 {
		burst = max(1, int(math.Ceil(perSecond)))
	}
	return &rateLimiter{limit: rate.Limit(perSecond), burst: burst, max: maxBuckets, now: time.Now, buckets: map[string]*rateBucket{}}
}

// take takes a token of key's bucket; if there is none, it returns how long until there is one.
func (l *rateLimiter) take(key string) (ok bool, retryAfter time.Duration) {
	if l == nil {
		return true, 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= l.max {
			l.evict(now)
		}
		b = &rateBucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.buckets[key] = b
	}
	r := b.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// evict drops the buckets that have refilled (a new one is the same); if none has, the fullest
// one, whose user gains the least from a fresh bucket (never the one of a user being limited
// while others have tokens left).
func (l *rateLimiter) evict(now time.Time) {
	fullest, most := "", -1.0
	for k, b := range l.buckets {
		tokens := b.lim.TokensAt(now)
		if tokens >= float64(l.burst) {
			delete(l.buckets, k)
			continue
		}
		if tokens > most {
			fullest, most = k, tokens
		}
	}
	if len(l.buckets) >= l.max && fullest != "" {
		delete(l.buckets, fullest)
	}
}

// size is how many buckets are in memory.
func (l *rateLimiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// checkRate takes a token of c's bucket, or refuses the call with -32007 and the wait.
func (s *Server) checkRate(c *Caller, method string) error {
	ok, wait := s.rate.take("user/" + c.Username)
	if ok {
		return nil
	}
	secs := max(1, int(math.Ceil(wait.Seconds())))
	return &kite.Error{Code: kite.CodeRateLimited, Data: &kite.ErrorData{Type: kite.ErrRateLimited.Type(), Details: map[string]any{"retryAfterMs": wait.Milliseconds()}},
		Message: fmt.Sprintf("rate limited: retry in %ds (%s by %s: each user may make %g calls a second, %d at once; kloud serve --rate-limit, --rate-burst)",
			secs, method, c.Username, float64(s.rate.limit), s.rate.burst)}
}
