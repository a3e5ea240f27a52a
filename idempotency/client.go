package idempotency

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/retry"
)

// Defaults for Transport fields left at their zero value.
const (
	DefaultMaxAttempts          = 5
	DefaultRetryInitialInterval = 100 * time.Millisecond
	DefaultRetryMaxInterval     = 5 * time.Second
	DefaultRetryBudget          = 0.2
)

// Transport is an http.RoundTripper that makes requests safe to retry, and
// retries them. A request of Methods gets one key per logical operation:
// the one it carries in Header, or a new random one, sent unchanged on
// every retry of the operation (never one made from a time or an attempt
// count, which would make each retry a new operation). One RoundTrip is one
// operation; a caller that retries on its own sets the key itself and
// keeps it.
//
// It retries what may pass: a request that got no response (a network
// error, a timeout of the server), 5xx, 429 and 409 (the same key still in
// progress). It never retries another 4xx: the request is wrong, and
// sending it again will not fix it. Waits grow exponentially with full
// jitter, from RetryInitialInterval up to RetryMaxInterval, or are what
// the server's Retry-After asks; no wait runs past the request's context
// deadline: the last response or error is returned instead. A request
// whose body cannot be read again (no GetBody) is sent once.
//
// Retries are budgeted: each request earns Budget retries (0.2: one retry
// for five requests), up to a reserve of ten, and a retry spends one. When
// the budget is spent, as when a server is down for everyone, requests fail
// fast instead of multiplying the load on it.
type Transport struct {
	// Base sends the requests. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// Header carries the key. Defaults to DefaultHeader.
	Header string
	// Methods are those whose requests get a key and may be retried.
	// Defaults to POST and PATCH (GET, HEAD, PUT, DELETE and OPTIONS are
	// idempotent already and are retried without a key).
	Methods []string
	// MaxAttempts bounds the attempts at one request, the first included.
	// Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// RetryInitialInterval and RetryMaxInterval shape the waits. Defaults:
	// DefaultRetryInitialInterval, DefaultRetryMaxInterval.
	RetryInitialInterval, RetryMaxInterval time.Duration
	// Budget is the retries each request earns (see above). Defaults to
	// DefaultRetryBudget; negative turns retries off.
	Budget float64
	// NewKey makes a key for a request that has none. Defaults to 128
	// random bits in hex.
	NewKey func() string

	once   sync.Once
	tokens budget
}

// idempotentMethods are retried without a key.
var idempotentMethods = []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodOptions}

func (t *Transport) init() {
	t.once.Do(func() {
		if t.Base == nil {
			t.Base = http.DefaultTransport
		}
		if t.Header == "" {
			t.Header = DefaultHeader
		}
		if t.Methods == nil {
			t.Methods = []string{http.MethodPost, http.MethodPatch}
		}
		if t.MaxAttempts <= 0 {
			t.MaxAttempts = DefaultMaxAttempts
		}
		if t.RetryInitialInterval <= 0 {
			t.RetryInitialInterval = DefaultRetryInitialInterval
		}
		if t.RetryMaxInterval < t.RetryInitialInterval {
			t.RetryMaxInterval = max(DefaultRetryMaxInterval, t.RetryInitialInterval)
		}
		if t.Budget == 0 {
			t.Budget = DefaultRetryBudget
		}
		if t.NewKey == nil {
			t.NewKey = randomKey
		}
		t.tokens = budget{earn: t.Budget, reserve: 10, tokens: 10}
	})
}

// RoundTrip sends req, retrying as the Transport's rules say. Once it has
// made a key, it does not change req: it sends copies.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.init()
	method := req.Method
	if method == "" {
		method = http.MethodGet // as net/http reads it
	}
	keyed := slices.Contains(t.Methods, method)
	retryable := keyed || slices.Contains(idempotentMethods, method)
	t.tokens.deposit()
	if keyed && req.Header.Get(t.Header) == "" {
		req = req.Clone(req.Context())
		req.Header.Set(t.Header, t.NewKey())
	}
	waits := retry.Policy{Initial: t.RetryInitialInterval, Max: t.RetryMaxInterval}.New()
	for attempt := 1; ; attempt++ {
		resp, err := t.Base.RoundTrip(req)
		wait, again := t.retryAfter(resp, err, keyed)
		if !again || !retryable || attempt >= t.MaxAttempts || req.Context().Err() != nil {
			return resp, err
		}
		next, ok := t.rewind(req)
		if !ok {
			return resp, err
		}
		if wait == 0 {
			wait = waits.Next()
		}
		if deadline, ok := req.Context().Deadline(); ok && time.Until(deadline) < wait {
			return resp, err // the wait would outlive the caller
		}
		if !t.tokens.spend() {
			return resp, err // the budget is spent: fail fast
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		if err := retry.Sleep(req.Context(), wait); err != nil {
			return nil, err
		}
		req = next
	}
}

// retryAfter says whether a result may pass on a retry, and the wait the
// server asked for (0: none). A 409 may pass only for a keyed request: its
// key's first request is still running.
func (t *Transport) retryAfter(resp *http.Response, err error, keyed bool) (time.Duration, bool) {
	if err != nil {
		return 0, true
	}
	if resp.Header.Get(ReplayedHeader) == "true" {
		return 0, false // a stored answer: sending the key again gets it again
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode >= 500, keyed && resp.StatusCode == http.StatusConflict:
		return parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), true
	}
	return 0, false
}

// rewind returns a copy of req to send again, with its body read anew.
func (t *Transport) rewind(req *http.Request) (*http.Request, bool) {
	next := req.Clone(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return next, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, false
	}
	next.Body = body
	return next, true
}

// maxRetryAfter bounds a Retry-After, so that a huge one cannot overflow
// into a negative wait.
const maxRetryAfter = 24 * time.Hour

// parseRetryAfter reads a Retry-After value: seconds, or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		if s > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter // beyond any deadline: not waited for
		}
		return time.Duration(s) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now)
	}
	return 0
}

// budget is a token bucket of retries: requests earn them, retries spend
// them.
type budget struct {
	mu      sync.Mutex
	earn    float64
	reserve float64
	tokens  float64
}

func (b *budget) deposit() {
	b.mu.Lock()
	b.tokens = min(b.reserve, b.tokens+max(b.earn, 0))
	b.mu.Unlock()
}

func (b *budget) spend() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.earn < 0 || b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func randomKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Errorf("idempotency: no randomness for a key: %w", err))
	}
	return hex.EncodeToString(b[:])
}
