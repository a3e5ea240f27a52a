package idempotency_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
)

// flaky is a server that answers each request with the next of its
// statuses (the last one over and over), recording what it was sent.
type flaky struct {
	mu       sync.Mutex
	statuses []int
	header   http.Header // set on every answer
	hangUp   int         // the first this many requests get no answer at all
	keys     []string
	bodies   []string
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	n := len(f.keys)
	f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
	b, _ := io.ReadAll(r.Body)
	f.bodies = append(f.bodies, string(b))
	status := f.statuses[min(n, len(f.statuses)-1)]
	hangUp := n < f.hangUp
	f.mu.Unlock()
	if hangUp {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
		return
	}
	for k, v := range f.header {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
}

func (f *flaky) attempts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.keys)
}

func newClient(t *testing.T, f *flaky, tr *idempotency.Transport) (*http.Client, string) {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	tr.RetryInitialInterval = time.Millisecond
	tr.RetryMaxInterval = 5 * time.Millisecond
	return &http.Client{Transport: tr}, srv.URL
}

// postWithin posts to url through c with a deadline d away, and returns
// the answer (its body closed).
func postWithin(t *testing.T, c *http.Client, url string, d time.Duration) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`x`))
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

func TestTheClientRetriesWithTheSameKeyAndBody(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{0, 503, 500, 201}, hangUp: 1} // the first gets no answer
	c, url := newClient(t, f, &idempotency.Transport{})
	resp, err := c.Post(url, "application/json", strings.NewReader(`{"amount":5}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 201, resp.StatusCode)
	require.Equal(t, 4, f.attempts(), "a lost connection, 503, 500, then 201")
	require.NotEmpty(t, f.keys[0])
	for i := range f.keys {
		require.Equal(t, f.keys[0], f.keys[i], "the same key on every attempt")
		require.Equal(t, `{"amount":5}`, f.bodies[i], "the same body on every attempt")
	}

	f2 := &flaky{statuses: []int{201}}
	c2, url2 := newClient(t, f2, &idempotency.Transport{})
	for range 2 {
		resp, err := c2.Post(url2, "application/json", strings.NewReader(`{}`))
		require.NoError(t, err)
		resp.Body.Close()
	}
	require.NotEqual(t, f2.keys[0], f2.keys[1], "a new operation, a new key")
}

func TestTheClientKeepsTheCallersKey(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{409, 201}}
	c, url := newClient(t, f, &idempotency.Transport{})
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`x`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "order-42")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, []string{"order-42", "order-42"}, f.keys, "409 (in progress) is retried with the caller's key")
}

func TestTheClientNeverRetriesOtherClientErrors(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 401, 403, 404, 422} {
		f := &flaky{statuses: []int{status, 201}}
		c, url := newClient(t, f, &idempotency.Transport{})
		resp, err := c.Post(url, "text/plain", strings.NewReader(`x`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, status, resp.StatusCode)
		require.Equal(t, 1, f.attempts(), "status %d", status)
	}
}

func TestTheClientHonoursRetryAfterAndTheDeadline(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{429, 201}, header: http.Header{"Retry-After": {"1"}}}
	c, url := newClient(t, f, &idempotency.Transport{})
	began := time.Now()
	resp, err := c.Post(url, "text/plain", strings.NewReader(`x`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 201, resp.StatusCode)
	require.GreaterOrEqual(t, time.Since(began), 900*time.Millisecond, "waited the second Retry-After asked for")

	slow := &flaky{statuses: []int{503}, header: http.Header{"Retry-After": {"30"}}}
	c, url = newClient(t, slow, &idempotency.Transport{})
	began = time.Now()
	resp = postWithin(t, c, url, 2*time.Second)
	require.Equal(t, 503, resp.StatusCode, "a wait past the deadline is not started: the last answer is returned")
	require.Less(t, time.Since(began), time.Second)
	require.Equal(t, 1, slow.attempts())
}

func TestTheClientCapsAttemptsAndSpendsABudget(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{503}}
	c, url := newClient(t, f, &idempotency.Transport{MaxAttempts: 3})
	resp, err := c.Post(url, "text/plain", strings.NewReader(`x`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 3, f.attempts(), "MaxAttempts")

	down := &flaky{statuses: []int{503}}
	c, url = newClient(t, down, &idempotency.Transport{MaxAttempts: 5, Budget: 0.1})
	const requests = 50
	for range requests {
		resp, err := c.Post(url, "text/plain", strings.NewReader(`x`))
		require.NoError(t, err)
		resp.Body.Close()
	}
	retries := down.attempts() - requests
	t.Logf("%d requests to a server that is down: %d retries (without the budget: %d)", requests, retries, requests*4)
	require.LessOrEqual(t, retries, 10+requests/10+1, "the reserve and a tenth of the requests")
}

func TestTheClientRetriesIdempotentMethodsWithoutAKey(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{502, 200}}
	c, url := newClient(t, f, &idempotency.Transport{})
	resp, err := c.Get(url)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, []string{"", ""}, f.keys)
}
