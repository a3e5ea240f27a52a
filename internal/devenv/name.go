package devenv

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// UniqueName returns prefix_<base>_<random>, where base is from (a test's
// name, say) reduced to lower case letters, digits and underscores and cut
// to its last 40 bytes: a name usable as a Postgres identifier, a topic or a
// consumer group, at most 63 bytes for a prefix of up to 13, and different
// on every call.
func UniqueName(prefix, from string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(from) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	base := b.String()
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	return prefix + "_" + strings.Trim(base, "_") + "_" + hex.EncodeToString(suffix[:])
}
