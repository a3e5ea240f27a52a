package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kafkaonce/kafkaonce/idempotency"
)

// operation is one payment a client wants made: one key, however many
// requests it takes.
type operation struct {
	client, key string
	req         PaymentRequest
	duplicates  int  // requests sent at once with the key (a client and its impatient twin)
	mismatch    bool // afterwards, the key is sent again for another amount
}

// clientStats counts what the clients sent and got back.
type clientStats struct {
	requests, replayed, conflicts, mismatches, mismatchesSent atomic.Int64
	done                                                      atomic.Int64

	mu        sync.Mutex
	responses map[string]map[string]bool // key -> the distinct 201 bodies it got
	failures  []string
}

// attempts is the Base of the clients' idempotency.Transport: it counts
// every request sent and what came back, and gives each request a
// timeout shorter than the server's slowest work, so that some successes
// reach the client too late (the timed-out success the keys exist for).
type attempts struct {
	base    http.RoundTripper
	timeout time.Duration
	stats   *clientStats
}

func (a *attempts) RoundTrip(req *http.Request) (*http.Response, error) {
	a.stats.requests.Add(1)
	ctx, cancel := context.WithTimeout(req.Context(), a.timeout)
	defer cancel()
	resp, err := a.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body) // within the timeout
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	switch {
	case resp.Header.Get(idempotency.ReplayedHeader) == "true":
		a.stats.replayed.Add(1)
	case resp.StatusCode == http.StatusConflict:
		a.stats.conflicts.Add(1)
	case resp.StatusCode == http.StatusUnprocessableEntity:
		a.stats.mismatches.Add(1)
	}
	return resp, nil
}

// clients make payments against url, each a patient client: it retries
// through idempotency.Transport, and when that gives up (its budget spent
// while the server is down), it tries again later with the same key.
type clients struct {
	url   string
	http  *http.Client
	stats *clientStats
}

func newClients(url string, timeout time.Duration) *clients {
	stats := &clientStats{responses: map[string]map[string]bool{}}
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	return &clients{url: url, stats: stats, http: &http.Client{Transport: &idempotency.Transport{
		Base:                 &attempts{base: base, timeout: timeout, stats: stats},
		RetryInitialInterval: 20 * time.Millisecond,
		RetryMaxInterval:     500 * time.Millisecond,
	}}}
}

// operations makes n payments for a few clients; some are sent twice at
// once, some have their key reused for another amount afterwards.
func operations(n int, runID string) []operation {
	rng := rand.New(rand.NewPCG(5, 6))
	ops := make([]operation, n)
	for i := range ops {
		ops[i] = operation{
			client:     fmt.Sprintf("client-%d", i%5),
			key:        fmt.Sprintf("pay-%s-%05d", runID, i),
			req:        PaymentRequest{Account: fmt.Sprintf("acct-%02d", rng.IntN(20)), Amount: 100 + rng.Int64N(10000)},
			duplicates: 1,
		}
		if rng.IntN(10) == 0 {
			ops[i].duplicates = 3
		}
		ops[i].mismatch = rng.IntN(20) == 0
	}
	return ops
}

// run makes every operation, with workers at a time, until ctx ends.
func (c *clients) run(ctx context.Context, ops []operation, workers int) {
	next := make(chan operation)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for op := range next {
				c.make(ctx, op)
				c.stats.done.Add(1)
			}
		}()
	}
	for _, op := range ops {
		select {
		case next <- op:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
}

// make sends op's request (several at once for a duplicated one) until it
// is answered 201, then, for a mismatch, its key for another amount.
func (c *clients) make(ctx context.Context, op operation) {
	var wg sync.WaitGroup
	for range op.duplicates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, err := c.untilCreated(ctx, op)
			c.stats.mu.Lock()
			defer c.stats.mu.Unlock()
			if err != nil {
				c.stats.failures = append(c.stats.failures, fmt.Sprintf("%s: %v", op.key, err))
				return
			}
			if c.stats.responses[op.key] == nil {
				c.stats.responses[op.key] = map[string]bool{}
			}
			c.stats.responses[op.key][body] = true
		}()
	}
	wg.Wait()
	if op.mismatch {
		other := op
		other.req.Amount++
		c.stats.mismatchesSent.Add(1)
		status, body, err := c.send(ctx, other)
		if err == nil && status != http.StatusUnprocessableEntity {
			c.stats.mu.Lock()
			c.stats.failures = append(c.stats.failures, fmt.Sprintf("%s reused for another amount: answered %d %s, not 422", op.key, status, body))
			c.stats.mu.Unlock()
		}
	}
}

// untilCreated sends op until it is answered 201, and returns the body.
func (c *clients) untilCreated(ctx context.Context, op operation) (string, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		status, body, err := c.send(ctx, op)
		switch {
		case err == nil && status == http.StatusCreated:
			return body, nil
		case err == nil && status >= 400 && status < 500 && status != http.StatusConflict && status != http.StatusTooManyRequests:
			return "", fmt.Errorf("answered %d: %s", status, body)
		case ctx.Err() != nil:
			return "", ctx.Err()
		case time.Now().After(deadline):
			return "", fmt.Errorf("not created within 2m: last %d %v", status, err)
		}
		time.Sleep(100 * time.Millisecond) // the Transport gave up for now; the operation has not
	}
}

// send sends op once through the Transport (which may retry it).
func (c *clients) send(ctx context.Context, op operation) (int, string, error) {
	body, _ := json.Marshal(op.req)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/payments", strings.NewReader(string(body)))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", op.key)
	req.Header.Set("X-Client", op.client)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
