package faultproxy

import (
	"net"
	"sync"
)

// Silent is a server that accepts connections and never answers them, as
// a Postgres, a broker or a container engine that hangs does: a client
// with no deadline of its own waits on it forever.
type Silent struct {
	ln   net.Listener
	done chan struct{}
	mu   sync.Mutex
	held []net.Conn
}

// StartSilent listens on a loopback port chosen by the system.
func StartSilent() (*Silent, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Silent{ln: ln, done: make(chan struct{})}
	go s.accept()
	return s, nil
}

// Addr is the address to point a client at.
func (s *Silent) Addr() string { return s.ln.Addr().String() }

// Close stops listening and closes every connection accepted, so that a
// client waiting on one gets an error; it returns once nothing more is
// accepted.
func (s *Silent) Close() error {
	err := s.ln.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.held {
		c.Close()
	}
	s.held = nil
	return err
}

func (s *Silent) accept() {
	defer close(s.done)
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.held = append(s.held, c)
		s.mu.Unlock()
	}
}
