// Package pgtext makes any Go string storable in a Postgres text (or JSON)
// value. Postgres refuses text that is not valid UTF-8 or holds a NUL
// byte, and kafkaonce stores text it does not control — error messages
// that quote a payload, header names — in the same transaction that moves
// a partition past a message: a refusal there would stop the partition for
// ever, so such text is cleaned first.
package pgtext

import "strings"

// Clean returns s with each invalid UTF-8 sequence and each NUL byte
// replaced by U+FFFD.
func Clean(s string) string {
	if Storable(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// Storable reports whether Postgres accepts s as text as it is.
func Storable(s string) bool {
	return !strings.Contains(s, "\x00") && strings.ToValidUTF8(s, "") == s
}

// Cut is Clean(s) in at most max bytes, cut at a character boundary and
// ending in a marker that says so when it was cut: for text stored for
// operators to read, such as the error that stopped something.
func Cut(s string, max int) string {
	s = Clean(s)
	if len(s) <= max {
		return s
	}
	if max < len(cutMarker) {
		return strings.ToValidUTF8(s[:max], "")
	}
	return strings.ToValidUTF8(s[:max-len(cutMarker)], "") + cutMarker
}

const cutMarker = "... [truncated]"
