package faultproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Kafka is a TCP proxy between one Kafka client and a cluster, so that a
// test can take that client, and no other, off the network: the other
// clients of the same broker reach it directly. A Kafka client learns
// brokers' addresses from the cluster (Metadata, FindCoordinator, ...)
// and connects to those, not to the address it was given: the proxy
// rewrites every broker address in the answers it forwards to one of its
// own, a front per broker, so that the client's every connection goes
// through it, whatever the broker advertises.
type Kafka struct {
	mu      sync.Mutex
	fronts  map[string]*kafkaFront // by broker address
	conns   map[net.Conn]struct{}
	state   linkState
	resumed chan struct{} // closed when a Block ends
	closed  bool
	wg      sync.WaitGroup
	bootstr *kafkaFront
}

// linkState is how the proxy treats its connections.
type linkState int

const (
	linkUp      linkState = iota
	linkCut               // connections closed, new ones closed at once
	linkBlocked           // nothing forwarded either way, connections left open
)

// kafkaFront is the proxy's listener for one broker.
type kafkaFront struct {
	ln     net.Listener
	target string
}

// StartKafka starts a proxy whose first front forwards to bootstrap: give
// the client Addr as its only broker.
func StartKafka(bootstrap string) (*Kafka, error) {
	k := &Kafka{fronts: map[string]*kafkaFront{}, conns: map[net.Conn]struct{}{}, resumed: make(chan struct{})}
	f, err := k.front(bootstrap)
	if err != nil {
		return nil, err
	}
	k.bootstr = f
	return k, nil
}

// Addr is the "host:port" to give the client as its broker.
func (k *Kafka) Addr() string { return k.bootstr.ln.Addr().String() }

// Cut takes the client off the network at once: every connection is
// closed, and new ones are closed as soon as they are accepted, until
// Restore. The client sees its requests fail and its dials hang up.
func (k *Kafka) Cut() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.setState(linkCut)
	for c := range k.conns {
		c.Close()
	}
}

// Block stops forwarding, either way, until Restore, and leaves the
// connections open, as a network that loses every packet does: the
// client hears nothing and gives up on its requests when its own
// timeouts say so. What was sent meanwhile is forwarded on Restore, on
// the connections still open then.
func (k *Kafka) Block() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.setState(linkBlocked)
}

// Restore puts the client back on the network.
func (k *Kafka) Restore() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.setState(linkUp)
}

// setState moves to s; k.mu is held.
func (k *Kafka) setState(s linkState) {
	if k.state == linkBlocked && s != linkBlocked {
		close(k.resumed)
		k.resumed = make(chan struct{})
	}
	k.state = s
}

// Close stops every front, closes every connection and waits for the
// proxy's goroutines.
func (k *Kafka) Close() error {
	k.mu.Lock()
	k.closed = true
	k.setState(linkCut)
	for _, f := range k.fronts {
		f.ln.Close()
	}
	for c := range k.conns {
		c.Close()
	}
	k.mu.Unlock()
	k.wg.Wait()
	return nil
}

// front returns the front of the broker at target, starting it if need
// be.
func (k *Kafka) front(target string) (*kafkaFront, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if f := k.fronts[target]; f != nil {
		return f, nil
	}
	if k.closed {
		return nil, errors.New("faultproxy: closed")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &kafkaFront{ln: ln, target: target}
	k.fronts[target] = f
	k.wg.Add(1)
	go k.accept(f)
	return f, nil
}

func (k *Kafka) accept(f *kafkaFront) {
	defer k.wg.Done()
	for {
		client, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !k.waitUp() {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", f.target)
		if err != nil {
			client.Close()
			continue
		}
		if !k.track(client, server) {
			continue
		}
		pending := &inflight{reqs: map[int32]reqKind{}}
		k.wg.Add(2)
		go func() {
			defer k.wg.Done()
			_ = k.requests(server, client, pending)
			k.untrack(client, server)
		}()
		go func() {
			defer k.wg.Done()
			_ = k.responses(client, server, pending)
			k.untrack(client, server)
		}()
	}
}

// waitUp waits while the proxy is blocked, and reports whether it is up.
func (k *Kafka) waitUp() bool {
	for {
		k.mu.Lock()
		s, resumed := k.state, k.resumed
		k.mu.Unlock()
		switch s {
		case linkUp:
			return true
		case linkCut:
			return false
		}
		<-resumed
	}
}

func (k *Kafka) track(cs ...net.Conn) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.state == linkCut {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		k.conns[c] = struct{}{}
	}
	return true
}

func (k *Kafka) untrack(cs ...net.Conn) {
	k.mu.Lock()
	for _, c := range cs {
		delete(k.conns, c)
	}
	k.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// reqKind is what a response answers: its request's key and version.
type reqKind struct{ key, version int16 }

// inflight are a connection's requests awaiting their responses, by
// correlation id.
type inflight struct {
	mu   sync.Mutex
	reqs map[int32]reqKind
}

// requests forwards the client's requests, noting each one's kind.
func (k *Kafka) requests(dst, src net.Conn, pending *inflight) error {
	for {
		frame, err := readFrame(src)
		if err != nil {
			return err
		}
		if len(frame) < 12 {
			return errors.New("faultproxy: short Kafka request")
		}
		kind := reqKind{int16(binary.BigEndian.Uint16(frame[4:])), int16(binary.BigEndian.Uint16(frame[6:]))} //nolint:gosec // wire fields
		corr := int32(binary.BigEndian.Uint32(frame[8:]))                                                     //nolint:gosec // wire field
		pending.mu.Lock()
		pending.reqs[corr] = kind
		pending.mu.Unlock()
		if !k.waitUp() {
			return errors.New("faultproxy: cut")
		}
		if _, err := dst.Write(frame); err != nil {
			return err
		}
	}
}

// responses forwards the broker's responses, each broker address in them
// replaced by the address of the proxy's front for that broker.
func (k *Kafka) responses(dst, src net.Conn, pending *inflight) error {
	for {
		frame, err := readFrame(src)
		if err != nil {
			return err
		}
		if len(frame) < 8 {
			return errors.New("faultproxy: short Kafka response")
		}
		corr := int32(binary.BigEndian.Uint32(frame[4:])) //nolint:gosec // wire field
		pending.mu.Lock()
		kind, ok := pending.reqs[corr]
		delete(pending.reqs, corr)
		pending.mu.Unlock()
		if ok {
			if frame, err = k.rewrite(kind, frame); err != nil {
				return err
			}
		}
		if !k.waitUp() {
			return errors.New("faultproxy: cut")
		}
		if _, err := dst.Write(frame); err != nil {
			return err
		}
	}
}

// rewrite returns frame, a response of kind, with its broker addresses
// replaced by the proxy's fronts; responses that carry none are returned
// as they are.
func (k *Kafka) rewrite(kind reqKind, frame []byte) ([]byte, error) {
	switch kind.key {
	case 0, 1, 3, 10, 60, 78, 79: // Produce, Fetch, Metadata, FindCoordinator, DescribeCluster, ShareFetch, ShareAcknowledge
	default:
		return frame, nil
	}
	req := kmsg.RequestForKey(kind.key)
	req.SetVersion(kind.version)
	head := 8 // size, correlation id
	if req.IsFlexible() {
		n, err := skipTags(frame[head:])
		if err != nil {
			return nil, err
		}
		head += n
	}
	resp := kmsg.ResponseForKey(kind.key)
	resp.SetVersion(kind.version)
	if err := resp.ReadFrom(frame[head:]); err != nil {
		return nil, fmt.Errorf("faultproxy: decode response to key %d v%d: %w", kind.key, kind.version, err)
	}
	changed := false
	swap := func(host *string, port *int32) {
		f, err := k.front(net.JoinHostPort(*host, strconv.Itoa(int(*port))))
		if err != nil {
			return // closing: the connection goes too
		}
		a := f.ln.Addr().(*net.TCPAddr)
		*host, *port, changed = a.IP.String(), int32(a.Port), true //nolint:gosec // a port
	}
	switch r := resp.(type) {
	case *kmsg.ProduceResponse:
		for i := range r.Brokers {
			swap(&r.Brokers[i].Host, &r.Brokers[i].Port)
		}
	case *kmsg.FetchResponse:
		for i := range r.Brokers {
			swap(&r.Brokers[i].Host, &r.Brokers[i].Port)
		}
	case *kmsg.MetadataResponse:
		for i := range r.Brokers {
			swap(&r.Brokers[i].Host, &r.Brokers[i].Port)
		}
	case *kmsg.FindCoordinatorResponse:
		if r.Host != "" {
			swap(&r.Host, &r.Port)
		}
		for i := range r.Coordinators {
			if r.Coordinators[i].Host != "" {
				swap(&r.Coordinators[i].Host, &r.Coordinators[i].Port)
			}
		}
	case *kmsg.DescribeClusterResponse:
		for i := range r.Brokers {
			swap(&r.Brokers[i].Host, &r.Brokers[i].Port)
		}
	case *kmsg.ShareFetchResponse:
		for i := range r.NodeEndpoints {
			swap(&r.NodeEndpoints[i].Host, &r.NodeEndpoints[i].Port)
		}
	case *kmsg.ShareAcknowledgeResponse:
		for i := range r.NodeEndpoints {
			swap(&r.NodeEndpoints[i].Host, &r.NodeEndpoints[i].Port)
		}
	}
	if !changed {
		return frame, nil
	}
	out := append([]byte(nil), frame[:head]...)
	out = resp.AppendTo(out)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4)) //nolint:gosec // bounded by maxMessage
	return out, nil
}

// skipTags returns the length of the tagged fields at the start of b.
func skipTags(b []byte) (int, error) {
	n, l := binary.Uvarint(b)
	if l <= 0 {
		return 0, errors.New("faultproxy: bad tagged fields")
	}
	at := l
	for range n {
		_, l := binary.Uvarint(b[at:])
		if l <= 0 {
			return 0, errors.New("faultproxy: bad tag")
		}
		at += l
		size, l := binary.Uvarint(b[at:])
		if l <= 0 || uint64(len(b)-at-l) < size {
			return 0, errors.New("faultproxy: bad tag size")
		}
		at += l + int(size) //nolint:gosec // checked just above
	}
	return at, nil
}

// readFrame reads one size-prefixed Kafka message, its size included.
func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxMessage {
		return nil, errors.New("faultproxy: Kafka message too large")
	}
	frame := make([]byte, 4+n)
	copy(frame, hdr[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}
