package faultproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Listener wraps a server's listener so that a test can slow down and cut
// the server's connections: wrap the in-process Kafka broker's listener
// with it (kfake.ListenFn), and every client connection to the broker goes
// through it, whatever address the broker advertises.
type Listener struct {
	net.Listener
	mu      sync.Mutex
	conns   map[*faultConn]struct{}
	latency atomic.Int64
	cuts    atomic.Int64
}

// Wrap wraps l.
func Wrap(l net.Listener) *Listener {
	return &Listener{Listener: l, conns: map[*faultConn]struct{}{}}
}

// Accept wraps each accepted connection.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[fc] = struct{}{}
	l.mu.Unlock()
	return fc, nil
}

// SetLatency delays every read on the server side by d.
func (l *Listener) SetLatency(d time.Duration) { l.latency.Store(int64(d)) }

// CutAll closes every open connection at once, as a network failure would.
func (l *Listener) CutAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		c.Conn.Close()
		delete(l.conns, c)
	}
	l.cuts.Add(1)
}

// Cuts counts CutAll calls.
func (l *Listener) Cuts() int64 { return l.cuts.Load() }

type faultConn struct {
	net.Conn
	l *Listener
}

func (c *faultConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if d := time.Duration(c.l.latency.Load()); d > 0 && n > 0 {
		time.Sleep(d)
	}
	return n, err
}

func (c *faultConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
