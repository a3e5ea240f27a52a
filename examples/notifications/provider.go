package main

import (
	"encoding/json"
	"net"
	"net/http"
	"sync"
)

// provider is a local stand-in for an e-mail API. It honours the
// Idempotency-Key header the way real providers do: a request with a key it
// has seen returns the first answer and sends nothing. To be realistic it
// also misbehaves: every Nth new request gets 503 with Retry-After, and
// every Mth is accepted (the e-mail goes out) but the connection drops
// before the answer — the timed-out success that makes naive senders send
// twice.
type provider struct {
	mu         sync.Mutex
	sent       map[string]int // order id -> e-mails sent
	keys       map[string]bool
	requests   int
	deduped    int
	busy       int
	lost       int
	busyEvery  int
	loseEvery  int
	newRequest int
}

type email struct {
	OrderID string `json:"order_id"`
	To      string `json:"to"`
	Subject string `json:"subject"`
}

func newProvider(busyEvery, loseEvery int) *provider {
	return &provider{sent: map[string]int{}, keys: map[string]bool{}, busyEvery: busyEvery, loseEvery: loseEvery}
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var e email
	if key == "" || json.NewDecoder(r.Body).Decode(&e) != nil {
		http.Error(w, "need an Idempotency-Key and a JSON e-mail", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.requests++
	if p.keys[key] {
		p.deduped++
		p.mu.Unlock()
		w.WriteHeader(http.StatusOK) // the first answer again; nothing is sent
		return
	}
	p.newRequest++
	if p.busyEvery > 0 && p.newRequest%p.busyEvery == 0 {
		p.busy++
		p.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	p.keys[key] = true
	p.sent[e.OrderID]++
	lose := p.loseEvery > 0 && p.newRequest%p.loseEvery == 0
	if lose {
		p.lost++
	}
	p.mu.Unlock()
	if lose {
		// Sent, but the answer never arrives.
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

type providerStats struct {
	Sent, Requests, Deduped, Busy, Lost int
	PerOrder                            map[string]int
}

func (p *provider) stats() providerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	per := make(map[string]int, len(p.sent))
	sent := 0
	for k, v := range p.sent {
		per[k] = v
		sent += v
	}
	return providerStats{Sent: sent, Requests: p.requests, Deduped: p.deduped, Busy: p.busy, Lost: p.lost, PerOrder: per}
}

// serve starts the provider on a loopback port.
func (p *provider) serve() (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: p}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}
