package idempotency

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// wire is a loopback server that answers each request with the header map
// registered for it, and reads back the raw bytes net/http sent.
type wire struct {
	srv     *httptest.Server
	mu      sync.Mutex
	headers map[string]http.Header
	next    int
}

func newWire(t testing.TB) *wire {
	w := &wire{headers: map[string]http.Header{}}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		h := w.headers[r.URL.Path]
		w.mu.Unlock()
		for name, values := range h {
			rw.Header()[name] = values
		}
		_, _ = io.WriteString(rw, "paid")
	}))
	t.Cleanup(w.srv.Close)
	return w
}

// send is what net/http writes of h around the body: the header lines
// and the trailer lines. Left out are the framing (Content-Length or
// chunked, which a declared trailer chooses), and the Date line when h
// does not set one (net/http's own, of the moment).
func (w *wire) send(t testing.TB, h http.Header) string {
	w.mu.Lock()
	w.next++
	path := "/" + strconv.Itoa(w.next)
	w.headers[path] = h
	w.mu.Unlock()
	conn, err := net.Dial("tcp", w.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(bufio.NewReader(conn))
	if err != nil {
		t.Fatal(err)
	}
	section, body, _ := bytes.Cut(raw, []byte("\r\n\r\n"))
	lines := strings.Split(string(section), "\r\n")
	if _, trailers, chunked := bytes.Cut(body, []byte("\r\n0\r\n")); chunked {
		for _, line := range strings.Split(strings.TrimSuffix(string(trailers), "\r\n"), "\r\n") {
			if line != "" {
				lines = append(lines, "trailer "+line)
			}
		}
	}
	_, ownDate := h["Date"]
	kept := lines[:0]
	for _, line := range lines {
		framing := strings.HasPrefix(line, "Content-Length: ") || strings.HasPrefix(line, "Transfer-Encoding: ")
		if framing || !ownDate && strings.HasPrefix(line, "Date: ") {
			continue
		}
		kept = append(kept, line)
	}
	return strings.Join(kept, "\r\n")
}

// headerMap reads fuzz input as a header map: fields separated by NUL
// alternate name and value; a value of "-" adds the name with no values.
func headerMap(data string) http.Header {
	h := http.Header{}
	fields := strings.Split(data, "\x00")
	for i := 0; i+1 < len(fields); i += 2 {
		name, value := fields[i], fields[i+1]
		if value == "-" {
			if _, ok := h[name]; !ok {
				h[name] = nil
			}
			continue
		}
		h[name] = append(h[name], value)
	}
	return h
}

// A replay of a stored header map goes out on the wire byte for byte as
// the first response went, less the headers that are never stored, for
// any bytes in names and values.
func FuzzStoredHeadersGoOutAsFirstSent(f *testing.F) {
	for _, seed := range []string{
		"X-Meta-ref\nSet-Cookie\x00session=attacker; Path=/",
		"X-A: B\x00c\x00X-A\x00d",
		"X-Ref\nX-Token\x00secret\x00x-token\x00secret",
		"Content-Type\x00-\x00Date\x00-",
		"Trailer:Set-Cookie\x00a\x00Trailer:X-Sum\x00b",
		"Trailer:\x00",
		"X-Raw\x00\xff\xfe caf\xe9\r\nInjected: yes\x00\x01\x00\x02",
		"Location\x00/v1/payments/7\x00Location\x00/again\x00Cache-Control\x00no-store",
		"\x00empty name\x00X-Empty\x00",
	} {
		f.Add(seed)
	}
	w := newWire(f)
	secret := []string{"X-Token"}
	f.Fuzz(func(t *testing.T, data string) {
		h := headerMap(data)
		replay, err := decodeHeaders(encodeHeaders(h, secret), secret)
		if err != nil {
			t.Fatalf("what was stored does not decode: %v", err)
		}
		sent := h.Clone()
		for name := range sent {
			bare := strings.TrimPrefix(name, http.TrailerPrefix)
			if strings.EqualFold(bare, "Set-Cookie") || strings.EqualFold(bare, "X-Token") {
				delete(sent, name) // never stored
			}
		}
		if first, again := w.send(t, sent), w.send(t, replay); first != again {
			t.Fatalf("header map %q\nfirst sent:\n%s\nreplay sent:\n%s", h, first, again)
		}
	})
}
