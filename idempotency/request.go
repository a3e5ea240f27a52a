package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// ValidateKey checks the rules every key must meet: 1 to MaxKeyLen bytes
// of printable ASCII (no spaces or control characters). UUIDs, ULIDs and
// the usual random tokens meet them. The error says which rule the key
// breaks.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return errors.New("is empty")
	case len(key) > MaxKeyLen:
		return fmt.Errorf("is %d bytes long, more than the %d allowed", len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("has a byte that is not printable ASCII at %d (0x%02x)", i, c)
		}
	}
	return nil
}

// maxRouteLen bounds a route from Config.Route.
const maxRouteLen = 2048

// validateText checks a scope or a route: storable as Postgres text, and at
// most limit bytes.
func validateText(text string, limit int) error {
	switch {
	case len(text) > limit:
		return fmt.Errorf("is %d bytes long, more than the %d allowed", len(text), limit)
	case strings.IndexByte(text, 0) >= 0:
		return errors.New("contains a NUL byte")
	case !utf8.ValidString(text):
		return errors.New("is not valid UTF-8")
	}
	return nil
}

// fingerprint is the SHA-256 of what makes two requests the same request:
// the method, the route, the body and the headers named in
// Config.FingerprintHeaders (each with all its values, in order). Every
// part is length-prefixed, so no two different requests share the bytes
// hashed.
func fingerprint(r *http.Request, route string, body []byte, headers []string) []byte {
	h := sha256.New()
	part := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	part([]byte(r.Method))
	part([]byte(route))
	part(body)
	for _, name := range headers {
		values := r.Header.Values(name)
		part([]byte(http.CanonicalHeaderKey(name)))
		part([]byte(strings.Join(values, "\n"))) // a value cannot hold a newline
		part([]byte{byte(len(values))})
	}
	return h.Sum(nil)
}
