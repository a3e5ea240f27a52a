package kafkago

import (
	"net"
	"sync"
)

// watchedConn tells Dials how a connection went by its first read: a
// connection kafka-go opened is not yet one that works. A broker that
// hangs up before its first answer (a TLS listener met in plaintext, a
// SASL refusal) fails the first read, and kafka-go hands that error to
// its caller alone, or retries it in silence.
type watchedConn struct {
	net.Conn
	once   sync.Once
	report func(error)
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	switch {
	case n > 0:
		c.once.Do(func() { c.report(nil) })
	case err != nil:
		c.once.Do(func() { c.report(err) })
	}
	return n, err
}
