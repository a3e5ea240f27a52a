package idempotency_test

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
)

func TestTheClientHonoursRetryAfterAsAnHTTPDate(t *testing.T) {
	t.Parallel()
	at := time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) // whole seconds: 1 to 2 s from now
	f := &flaky{statuses: []int{503, 201}, header: http.Header{"Retry-After": {at}}}
	c, url := newClient(t, f, &idempotency.Transport{})
	began := time.Now()
	resp, err := c.Post(url, "text/plain", strings.NewReader(`x`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 201, resp.StatusCode)
	require.GreaterOrEqual(t, time.Since(began), 900*time.Millisecond, "waited until the date")

	far := &flaky{statuses: []int{503}, header: http.Header{"Retry-After": {time.Now().Add(time.Minute).UTC().Format(http.TimeFormat)}}}
	c, url = newClient(t, far, &idempotency.Transport{})
	began = time.Now()
	resp = postWithin(t, c, url, 2*time.Second)
	require.Equal(t, 503, resp.StatusCode)
	require.Less(t, time.Since(began), time.Second)
	require.Equal(t, 1, far.attempts())
}

// A Retry-After too large for a time.Duration is a wait past any deadline,
// not a negative wait that retries at once.
func TestTheClientTakesAHugeRetryAfterAsAWaitPastTheDeadline(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"9223372037", "99999999999999"} {
		f := &flaky{statuses: []int{503}, header: http.Header{"Retry-After": {v}}}
		c, url := newClient(t, f, &idempotency.Transport{MaxAttempts: 3})
		postWithin(t, c, url, 2*time.Second)
		require.Equal(t, 1, f.attempts(), "Retry-After: %s asks for a wait past the deadline: no retry", v)
	}
}

// http.Client.Timeout is a deadline too: no wait is started past it, and
// the caller gets the last answer rather than a timeout error.
func TestTheClientDoesNotWaitPastTheHTTPClientTimeout(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{503}, header: http.Header{"Retry-After": {"30"}}}
	c, url := newClient(t, f, &idempotency.Transport{})
	c.Timeout = 2 * time.Second
	began := time.Now()
	resp, err := c.Post(url, "text/plain", strings.NewReader(`x`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode)
	require.Less(t, time.Since(began), time.Second)
	require.Equal(t, 1, f.attempts())
}

func TestTheClientRetriesA409OnlyForKeyedRequests(t *testing.T) {
	t.Parallel()
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		f := &flaky{statuses: []int{409, 200}}
		c, url := newClient(t, f, &idempotency.Transport{})
		req, err := http.NewRequest(method, url, nil)
		require.NoError(t, err)
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 409, resp.StatusCode, method)
		require.Equal(t, 1, f.attempts(), "%s: a 409 is a conflict of the resource, not a key in progress", method)
		require.Equal(t, []string{""}, f.keys, "%s gets no key", method)
	}
	f := &flaky{statuses: []int{409, 200}}
	c, url := newClient(t, f, &idempotency.Transport{})
	req, err := http.NewRequest(http.MethodPatch, url, strings.NewReader(`x`))
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 2, f.attempts(), "PATCH is keyed: its 409 is retried")
	require.Equal(t, f.keys[0], f.keys[1])
}

// A body that cannot be read again is sent once; a request without a body
// needs none to be retried.
func TestTheClientSendsABodyItCannotReadAgainOnce(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{503, 201}}
	c, url := newClient(t, f, &idempotency.Transport{})
	req, err := http.NewRequest(http.MethodPost, url, io.MultiReader(strings.NewReader(`{"amount":1}`)))
	require.NoError(t, err)
	require.Nil(t, req.GetBody)
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode)
	require.Equal(t, 1, f.attempts())
	require.Equal(t, []string{`{"amount":1}`}, f.bodies)

	f2 := &flaky{statuses: []int{503, 201}}
	c, url = newClient(t, f2, &idempotency.Transport{})
	resp, err = c.Post(url, "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 201, resp.StatusCode)
	require.Equal(t, 2, f2.attempts())
	require.Equal(t, f2.keys[0], f2.keys[1])
}

// The budget is shared by concurrent requests (run with -race).
func TestTheClientBudgetHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	down := &flaky{statuses: []int{503}}
	c, url := newClient(t, down, &idempotency.Transport{MaxAttempts: 5, Budget: 0.1})
	const workers, each = 8, 10
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				resp, err := c.Post(url, "text/plain", strings.NewReader(`x`))
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	retries := down.attempts() - workers*each
	t.Logf("%d requests, %d retries", workers*each, retries)
	require.LessOrEqual(t, retries, 10+workers*each/10+1)
}

// The Transport adds its key to a copy: the caller's request is untouched,
// and a caller's own key is never replaced.
func TestTheClientLeavesTheCallersRequestAlone(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{503, 201}}
	c, url := newClient(t, f, &idempotency.Transport{})
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`x`))
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Empty(t, req.Header.Get("Idempotency-Key"), "RoundTrip must not modify the request")
	require.Len(t, f.keys, 2)
	require.Equal(t, f.keys[0], f.keys[1])
}

// An empty Method means GET for a client request.
func TestTheClientRetriesARequestWithAnEmptyMethodAsAGet(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{502, 200}}
	c, u := newClient(t, f, &idempotency.Transport{})
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	resp, err := c.Do(&http.Request{URL: parsed, Header: http.Header{}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, 2, f.attempts())
}

// End to end: the Server commits, the response is lost on the way back,
// and the Transport's retry gets it from the key.
func TestTheClientGetsALostResponseFromTheServersKey(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	inner := p.srv.Config.Handler
	var lost atomic.Bool
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, r)
		if lost.CompareAndSwap(false, true) {
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = buf.Flush()
				conn.Close() // committed, but the client never hears
			}
			return
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(gw.Close)
	resp := postRetrying(t, gw.URL)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 1, p.count())
	require.EqualValues(t, 1, p.calls.Load())
}

// End to end: a retry that finds the key in progress gets 409 with
// Retry-After, waits, and then gets the response.
func TestTheClientWaitsOutAKeyInProgress(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	started, release := p.holdCalls()
	first := p.postInBackground("k", "alice", `{"amount":1,"account":"a"}`)
	<-started
	time.AfterFunc(300*time.Millisecond, func() { close(release) })
	c := &http.Client{Transport: &idempotency.Transport{}}
	req, err := http.NewRequest(http.MethodPost, p.srv.URL+"/v1/payments", strings.NewReader(`{"amount":1,"account":"a"}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("X-Client", "alice")
	began := time.Now()
	resp, err := c.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(bufio.NewReader(resp.Body))
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, (<-first).body, string(body))
	require.GreaterOrEqual(t, time.Since(began), 900*time.Millisecond, "Retry-After: 1")
	require.EqualValues(t, 1, p.calls.Load())
}
