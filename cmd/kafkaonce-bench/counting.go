package main

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
)

// wireCounters count, on the client side of the wire, what the issue's
// targets are stated in: database round trips and Kafka offset commits.
// Counting on the wire (not in our own code) makes every mode — hand-written
// loops and kafkaonce alike — measured the same way, against any broker.
type wireCounters struct {
	pgRoundTrips  atomic.Int64
	offsetCommits atomic.Int64
}

func (w *wireCounters) reset() {
	w.pgRoundTrips.Store(0)
	w.offsetCommits.Store(0)
}

// pgDial dials Postgres through a conn that counts round trips: a round
// trip is a burst of writes followed by a read, so a pipelined batch of
// statements is one, however many Write calls pgx makes for it.
func (w *wireCounters) pgDial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &pgCountingConn{Conn: c, n: &w.pgRoundTrips}, nil
}

type pgCountingConn struct {
	net.Conn
	n       *atomic.Int64
	writing atomic.Bool
}

func (c *pgCountingConn) Write(p []byte) (int, error) {
	if !c.writing.Swap(true) {
		c.n.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *pgCountingConn) Read(p []byte) (int, error) {
	c.writing.Store(false)
	return c.Conn.Read(p)
}

// kafkaDial dials a broker through a conn that parses the request frames
// the client writes and counts OffsetCommit requests (API key 8).
func (w *wireCounters) kafkaDial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &kafkaCountingConn{Conn: c, n: &w.offsetCommits}, nil
}

const apiKeyOffsetCommit = 8

// kafkaCountingConn follows the request framing ([int32 size][int16 api
// key]...) across Write calls of any size.
type kafkaCountingConn struct {
	net.Conn
	n    *atomic.Int64
	mu   sync.Mutex
	left int    // bytes of the current request still to come
	head []byte // the start of a frame, until size and api key are known
}

func (c *kafkaCountingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.scan(p)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *kafkaCountingConn) scan(p []byte) {
	for len(p) > 0 {
		if c.left > 0 {
			k := min(c.left, len(p))
			c.left -= k
			p = p[k:]
			continue
		}
		need := 6 - len(c.head)
		k := min(need, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
		if len(c.head) < 6 {
			return
		}
		size := int(binary.BigEndian.Uint32(c.head[:4]))
		if int16(binary.BigEndian.Uint16(c.head[4:6])) == apiKeyOffsetCommit {
			c.n.Add(1)
		}
		c.left = size - 2
		c.head = c.head[:0]
	}
}
