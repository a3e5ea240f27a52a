// Package faultproxy is a TCP proxy for tests that breaks connections on
// purpose: all at once, or a Postgres connection right after it forwarded a
// COMMIT, so the server commits and the client never hears of it.
package faultproxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections from a loopback port to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup

	dropCommits    atomic.Int64
	swallowCommits atomic.Int64
	commits        atomic.Int64
	dropped        atomic.Int64
	swallowed      atomic.Int64
	swallowedPort  atomic.Int64 // the server connection's local port, of the last swallowed COMMIT
	latency        atomic.Int64 // nanoseconds added to every forwarded chunk
	stallRollbacks atomic.Int64
	stalled        atomic.Int64
	// Round trips, once counting (see CountRoundTrips).
	counting   atomic.Bool
	roundTrips atomic.Int64
	cutTrip    atomic.Int64 // the round trip to cut; 0: none
	cutAfter   atomic.Bool
	tripsCut   atomic.Int64
}

// Start listens on 127.0.0.1 at a free port and forwards to target.
func Start(target string) (*Proxy, error) { return StartOn("127.0.0.1:0", target) }

// StartOn listens on addr and forwards to target.
func StartOn(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's "host:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DropAfterCommits makes the proxy cut the next n connections that send a
// COMMIT: it forwards the COMMIT, and cuts the client when the server
// answers it, so the server has committed and the client hears nothing.
func (p *Proxy) DropAfterCommits(n int) { p.dropCommits.Store(int64(n)) }

// SwallowCommits makes the proxy keep the next n COMMITs from the server:
// the client's connection is cut, while the server's is left open, so the
// server session stays in its transaction, holding its locks, until
// idle_in_transaction_session_timeout ends it.
func (p *Proxy) SwallowCommits(n int) { p.swallowCommits.Store(int64(n)) }

// Swallowed counts COMMITs kept from the server.
func (p *Proxy) Swallowed() int64 { return p.swallowed.Load() }

// SwallowedFrom is the local port of the proxy's connection to the server
// that carried the last swallowed COMMIT, 0 before the first: the
// client_port that pg_stat_activity shows for the session left open, so
// that a test can see what that session holds. It is set before Swallowed
// counts the COMMIT.
func (p *Proxy) SwallowedFrom() int { return int(p.swallowedPort.Load()) }

// StallRollbacks makes the proxy stall the next n connections that send a
// ROLLBACK: the ROLLBACK is not forwarded, nothing more is forwarded
// either way, and both sides stay open until the client closes its side
// (or the proxy is closed), as with a backend that stopped answering
// (hung on its storage, or stopped) while its TCP connection stays up.
func (p *Proxy) StallRollbacks(n int) { p.stallRollbacks.Store(int64(n)) }

// CountRoundTrips makes the proxy count, from now on, the round trips its
// clients send (RoundTrips): every message up to one after which the
// client waits for the server (a Sync, a simple Query; see endsRoundTrip).
// Each is held until its last message and then forwarded whole, so that a
// cut at a round trip (CutAtRoundTrip) comes either before the server saw
// any of it or after it had all of it: the boundaries a crash can fall
// on. The features that watch for COMMITs and ROLLBACKs do not apply
// while counting.
func (p *Proxy) CountRoundTrips() { p.counting.Store(true) }

// RoundTrips is how many round trips were counted.
func (p *Proxy) RoundTrips() int64 { return p.roundTrips.Load() }

// CutAtRoundTrip cuts the connection that sends the n-th round trip
// counted (1 is the next one after CountRoundTrips): before forwarding
// any of it, or, with after, once the server has it all, as its reply
// comes (the server ran it; the client never hears). For a round trip
// holding a COMMIT, the first is a crash before the COMMIT, the second a
// crash after it. Call it before CountRoundTrips.
func (p *Proxy) CutAtRoundTrip(n int64, after bool) {
	p.cutAfter.Store(after)
	p.cutTrip.Store(n)
}

// RoundTripsCut counts the cuts CutAtRoundTrip made (0 or 1).
func (p *Proxy) RoundTripsCut() int64 { return p.tripsCut.Load() }

// Stalled counts the connections stalled at a ROLLBACK.
func (p *Proxy) Stalled() int64 { return p.stalled.Load() }

// SetLatency delays everything forwarded, both ways, by d.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

func (p *Proxy) delay() {
	if d := time.Duration(p.latency.Load()); d > 0 {
		time.Sleep(d)
	}
}

// Commits counts the COMMITs forwarded.
func (p *Proxy) Commits() int64 { return p.commits.Load() }

// Dropped counts connections cut after a COMMIT.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// CutAll closes every open connection at once.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops accepting, cuts every connection and waits for the proxy's
// goroutines.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.track(client, server)
		p.wg.Add(2)
		st := &pairState{}
		go func() {
			defer p.wg.Done()
			switch p.clientToServer(client, server, st) {
			case keepServer:
				// The server side stays open, as a client that vanished
				// without a goodbye would leave it; the copy below ends
				// when the server gives up on the session.
				client.Close()
			case awaitReply:
				// The copy below cuts the client when the server answers.
			default:
				p.closePair(client, server)
			}
		}()
		go func() {
			defer p.wg.Done()
			p.copyDelayed(client, server, st)
			p.closePair(client, server)
		}()
	}
}

func (p *Proxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *Proxy) closePair(a, b net.Conn) {
	p.mu.Lock()
	delete(p.conns, a)
	delete(p.conns, b)
	p.mu.Unlock()
	a.Close()
	b.Close()
}

// Frontend startup codes that precede the real startup message.
const (
	sslRequest    = 80877103
	gssencRequest = 80877104
)

// pairState is what the two copies of a connection share.
type pairState struct {
	// dropReply means the server's next reply is the client's to lose.
	dropReply atomic.Bool
	// stalled means nothing more is forwarded either way, and both sides stay
	// open (see StallRollbacks).
	stalled atomic.Bool
}

// copyDelayed copies src to dst with the proxy's latency. Once dropReply
// is set, what src sends next is not forwarded: dst is cut instead. Once
// the pair is stalled, what src sends is read and dropped.
func (p *Proxy) copyDelayed(dst, src net.Conn, st *pairState) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && st.stalled.Load() {
			n = 0
		}
		if n > 0 && st.dropReply.Load() {
			dst.Close()
			_, _ = io.Copy(io.Discard, src)
			return
		}
		if n > 0 {
			p.delay()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				// The client is gone. Keep reading, as the kernel of a
				// vanished client would keep accepting: whether the other
				// side stays open is decided by whoever closes src.
				_, _ = io.Copy(io.Discard, src)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// ending is what becomes of a connection when the proxy stops forwarding
// the client's messages.
type ending int

const (
	closeBoth  ending = iota // both sides are closed
	keepServer               // the server side stays open (a swallowed COMMIT)
	awaitReply               // the client is cut when the server answers (a dropped COMMIT's reply)
)

// clientToServer forwards the client's messages one at a time, watching for
// COMMIT: a simple Query "commit", or an extended-protocol Bind of a
// statement that is one, which takes effect at the next Sync. It reports
// what becomes of the connection when it stops forwarding.
func (p *Proxy) clientToServer(client, server net.Conn, st *pairState) ending {
	// Startup: untyped messages (length, then payload).
	for {
		msg, err := readUntyped(client)
		if err != nil {
			return closeBoth
		}
		if _, err := server.Write(msg); err != nil {
			return closeBoth
		}
		code := binary.BigEndian.Uint32(msg[4:8])
		if code != sslRequest && code != gssencRequest {
			break
		}
	}
	pendingCommit := false
	// Statements that are a COMMIT, or a ROLLBACK, by name ("" for the
	// unnamed one): a client that caches statements (pgx does) parses
	// COMMIT once and later only binds it.
	commitStatements, rollbackStatements := map[string]bool{}, map[string]bool{}
	var held []byte // the messages of the round trip being counted
	for {
		msg, err := readTyped(client)
		if err != nil {
			return closeBoth
		}
		typ, body := msg[0], msg[5:]
		if p.counting.Load() {
			held = append(held, msg...)
			if !endsRoundTrip(typ) && typ != 'X' {
				continue
			}
			cut := noCut
			if typ != 'X' { // a Terminate waits for nothing
				cut = p.roundTrip()
			}
			if cut == cutBefore {
				return closeBoth
			}
			p.delay()
			if _, err := server.Write(held); err != nil {
				return closeBoth
			}
			held = held[:0]
			if cut == cutAfter {
				st.dropReply.Store(true)
				if tcp, ok := server.(*net.TCPConn); ok {
					_ = tcp.CloseWrite()
				}
				return awaitReply
			}
			continue
		}
		fires, commitAhead, rollback := false, false, false
		switch typ {
		case 'Q':
			fires, rollback = isCommit(body), isRollback(body)
		case 'P':
			// Parse: statement name, then query text. Parsing a COMMIT
			// runs nothing (pgx prepares statements in a round trip of
			// their own, with Describe and Sync): it is the Bind of it
			// that runs it, so only the statement is remembered here.
			if i := bytes.IndexByte(body, 0); i >= 0 {
				commitStatements[string(body[:i])] = isCommit(body[i+1:])
				rollbackStatements[string(body[:i])] = isRollback(body[i+1:])
			}
		case 'B':
			// Bind: portal name, then statement name.
			if i := bytes.IndexByte(body, 0); i >= 0 {
				rest := body[i+1:]
				if j := bytes.IndexByte(rest, 0); j >= 0 {
					if commitStatements[string(rest[:j])] {
						pendingCommit, commitAhead = true, true
					}
					rollback = rollbackStatements[string(rest[:j])]
				}
			}
		case 'S':
			fires, pendingCommit = pendingCommit, false
		}
		if rollback && p.stallRollbacks.Add(-1) >= 0 {
			// The ROLLBACK never reaches the server, and nothing more
			// goes either way: a backend that stopped answering, with
			// its TCP connection up.
			st.stalled.Store(true)
			p.stalled.Add(1)
			_, _ = io.Copy(io.Discard, client)
			return closeBoth
		} else if rollback {
			p.stallRollbacks.Add(1)
		}
		// A swallowed COMMIT never reaches the server: in a pipeline it is
		// held back from its Bind on, so the server runs what came before
		// it and keeps the transaction open.
		if (fires || commitAhead) && p.swallowCommits.Add(-1) >= 0 {
			if a, ok := server.LocalAddr().(*net.TCPAddr); ok {
				p.swallowedPort.Store(int64(a.Port))
			}
			p.swallowed.Add(1)
			if commitAhead {
				// End the pipeline without the COMMIT, so that the server
				// settles idle in the open transaction (where its idle
				// timeout applies) instead of waiting mid-pipeline.
				_, _ = server.Write([]byte{'S', 0, 0, 0, 4})
			}
			return keepServer
		} else if fires || commitAhead {
			p.swallowCommits.Add(1)
		}
		drop := fires && p.dropCommits.Add(-1) >= 0
		if fires && !drop {
			p.dropCommits.Add(1)
		}
		// Set before the COMMIT goes, so that no answer to it can slip
		// through to the client; the counters too, so that a client that
		// heard the answer (or lost it) finds the COMMIT counted.
		st.dropReply.Store(drop)
		if fires {
			p.commits.Add(1)
		}
		if drop {
			p.dropped.Add(1)
		}
		p.delay()
		if _, err := server.Write(msg); err != nil {
			return closeBoth
		}
		if drop {
			// The server reads the COMMIT, executes it and answers; the
			// copy of its answers cuts the client then, so the client
			// hears nothing, and only once the server committed. Its
			// input ends here, so it ends the session after.
			if tcp, ok := server.(*net.TCPConn); ok {
				_ = tcp.CloseWrite()
			}
			return awaitReply
		}
	}
}

// endsRoundTrip reports whether a message of type typ is the last the
// client sends before it waits for the server: a Sync, a simple Query, a
// Flush, the end of a COPY's data, a password or SASL response, a
// function call.
func endsRoundTrip(typ byte) bool {
	switch typ {
	case 'S', 'Q', 'H', 'c', 'f', 'p', 'F':
		return true
	}
	return false
}

// cutAt is what becomes of a round trip (see CutAtRoundTrip).
type cutAt int

const (
	noCut cutAt = iota
	cutBefore
	cutAfter
)

// roundTrip counts a round trip and says whether it is the one to cut.
func (p *Proxy) roundTrip() cutAt {
	n := p.roundTrips.Add(1)
	target := p.cutTrip.Load()
	switch {
	case target == 0 || n != target:
		return noCut
	case p.cutAfter.Load():
		p.tripsCut.Add(1)
		return cutAfter
	}
	p.tripsCut.Add(1)
	return cutBefore
}

func isRollback(query []byte) bool {
	q := bytes.TrimRight(query, "\x00")
	q = bytes.TrimSpace(bytes.TrimRight(bytes.TrimSpace(q), ";"))
	return bytes.EqualFold(q, []byte("rollback")) || bytes.EqualFold(q, []byte("abort"))
}

func isCommit(query []byte) bool {
	q := bytes.TrimRight(query, "\x00")
	q = bytes.TrimSpace(bytes.TrimRight(bytes.TrimSpace(q), ";"))
	return bytes.EqualFold(q, []byte("commit")) || bytes.EqualFold(q, []byte("end")) || bytes.EqualFold(q, []byte("commit transaction"))
}

const maxMessage = 64 << 20

func readUntyped(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 8 || n > maxMessage {
		return nil, errors.New("faultproxy: bad startup message length")
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

func readTyped(r io.Reader) ([]byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > maxMessage {
		return nil, errors.New("faultproxy: bad message length")
	}
	msg := make([]byte, 1+n)
	copy(msg, hdr[:])
	_, err := io.ReadFull(r, msg[5:])
	return msg, err
}
