package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// provider is a fake card provider, as real ones behave: it honours its
// own idempotency key (a charge repeated with the same key answers the
// first charge and charges nothing), and now and then it fails before
// charging (503) or charges and then answers too late for its caller.
type provider struct {
	srv *httptest.Server

	mu    sync.Mutex
	rng   *rand.Rand
	byKey map[string]string           // idempotency key -> charge id
	byRef map[int64]map[string]string // payment -> its charges (id -> key): more than one is a double charge
	calls int
}

func startProvider(failRate, slowRate float64) *provider {
	p := &provider{rng: rand.New(rand.NewPCG(3, 4)), byKey: map[string]string{}, byRef: map[int64]map[string]string{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Reference int64 `json:"reference"`
			Amount    int64 `json:"amount"`
		}
		key := r.Header.Get("Idempotency-Key")
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || key == "" {
			http.Error(w, "a charge needs a body and an Idempotency-Key", http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.calls++
		roll := p.rng.Float64()
		delay := time.Duration(2+p.rng.IntN(10)) * time.Millisecond
		if roll < failRate {
			p.mu.Unlock()
			http.Error(w, "card network unavailable", http.StatusServiceUnavailable)
			return
		}
		id, seen := p.byKey[key]
		if !seen {
			id = fmt.Sprintf("ch_%06d", len(p.byKey)+1)
			p.byKey[key] = id
			if p.byRef[req.Reference] == nil {
				p.byRef[req.Reference] = map[string]string{}
			}
			p.byRef[req.Reference][id] = key
		}
		p.mu.Unlock()
		if roll < failRate+slowRate {
			delay = 400 * time.Millisecond // charged, but the caller gives up first
		}
		time.Sleep(delay)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"id": id})
	}))
	return p
}

// tally is what the provider did: charges made, calls received, and
// payments charged more than once.
func (p *provider) tally() (charges, calls, doubleCharged int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, charges := range p.byRef {
		if len(charges) > 1 {
			doubleCharged++
		}
	}
	return len(p.byKey), p.calls, doubleCharged
}

func (p *provider) close() { p.srv.Close() }
