package idempotency

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// A stored response's headers are the handler's header map as it was when
// the response was sent, less what is never stored, so that a replay,
// written through net/http like the first response, goes out as the
// first did: net/http drops an invalid name, turns a line break in a value
// into a space, and sends no Date or sniffed Content-Type when the map
// holds the name with no values, and it does all of that again on the
// replay. Kept apart from the map:
//
//   - names net/http would drop (one that is not an HTTP token, such as
//     "X-A\nSet-Cookie"): they were never sent;
//   - Set-Cookie and Config.SecretHeaders, compared without regard to case
//     (and as trailers, "Trailer:Set-Cookie").
//
// The encoding is binary and length-prefixed, so no byte of a name or a
// value can be read as the start of another header: a version byte, then
// per name, in sorted order, its length and bytes, its count of values,
// and each value's length and bytes (unsigned varints).
const headersV1 = 0x01

// encodeHeaders is what is stored of h.
func encodeHeaders(h http.Header, secret []string) []byte {
	names := make([]string, 0, len(h))
	for name := range h {
		if storedHeader(name, secret) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	b := []byte{headersV1} // never nil: stored NOT NULL
	for _, name := range names {
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, uint64(len(h[name])))
		for _, v := range h[name] {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

// storedHeader reports whether a header named name is stored.
func storedHeader(name string, secret []string) bool {
	bare := strings.TrimPrefix(name, http.TrailerPrefix) // net/http sends "Trailer:X" as the trailer X
	if !httpguts.ValidHeaderFieldName(bare) {
		return false
	}
	return !strings.EqualFold(bare, "Set-Cookie") && !slices.ContainsFunc(secret, func(s string) bool { return strings.EqualFold(s, bare) })
}

// errHeadersCorrupt is the error of a stored header section that does not decode.
var errHeadersCorrupt = errors.New("the stored headers do not decode")

// decodeHeaders reads what encodeHeaders wrote, and the "Name: value"
// lines of rows stored before it, leaving out of those the headers never
// to be stored (secret are the server's SecretHeaders).
func decodeHeaders(b []byte, secret []string) (http.Header, error) {
	h := http.Header{}
	if len(b) == 0 || b[0] != headersV1 {
		return decodeHeaderLines(b, secret), nil
	}
	b = b[1:]
	next := func() (string, bool) {
		n, size := binary.Uvarint(b)
		if size <= 0 || n > uint64(len(b)-size) {
			return "", false
		}
		s := string(b[size : size+int(n)])
		b = b[size+int(n):]
		return s, true
	}
	for len(b) > 0 {
		name, ok := next()
		if !ok {
			return nil, errHeadersCorrupt
		}
		count, size := binary.Uvarint(b)
		if size <= 0 || count > uint64(len(b)) {
			return nil, errHeadersCorrupt
		}
		b = b[size:]
		values := make([]string, 0, count)
		for range count {
			v, ok := next()
			if !ok {
				return nil, errHeadersCorrupt
			}
			values = append(values, v)
		}
		if count == 0 {
			values = nil // present, with no values: net/http sends none, and adds none of its own
		}
		h[name] = values
	}
	return h, nil
}

// decodeHeaderLines reads the "Name: value" lines of rows stored before
// the binary encoding (their values had line breaks turned into spaces,
// their names not). A name holding a line break, which net/http dropped
// from the first response, reads as lines of its own here, and nothing
// tells them from the others: so Set-Cookie, the secret headers and
// invalid names are left out again, whatever line they come from.
func decodeHeaderLines(b []byte, secret []string) http.Header {
	h := http.Header{}
	for _, line := range strings.Split(string(b), "\n") {
		name, value, ok := strings.Cut(line, ": ")
		if ok && storedHeader(name, secret) {
			h[name] = append(h[name], value)
		}
	}
	return h
}
