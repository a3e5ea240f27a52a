package dedupe

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Fingerprint is a SHA-256 digest of a message's key and value.
type Fingerprint = kafkaoncetype.Fingerprint

// FingerprintOf returns the fingerprint of a message. The key's length is
// hashed before the key, so the split between key and value is part of the
// digest: key "ab" + value "c" differs from key "a" + value "bc". A nil key
// and an empty key are the same. Headers are not included: producers and
// proxies add and rewrite headers (tracing, retries) without changing what
// the message means.
func FingerprintOf(key, value []byte) Fingerprint {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(key)))
	h.Write(n[:])
	h.Write(key)
	h.Write(value)
	var f Fingerprint
	h.Sum(f[:0])
	return f
}
