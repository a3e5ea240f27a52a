package letters

import (
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/pgtext"
)

// truncateError makes an error text storable: cleaned of what Postgres
// refuses in text (see internal/pgtext), and cut to deadletter.MaxErrorLen.
func truncateError(s string) string {
	s = pgtext.Clean(s)
	if len(s) <= deadletter.MaxErrorLen {
		return s
	}
	cut := s[:deadletter.MaxErrorLen]
	// Do not split a UTF-8 sequence.
	for len(cut) > 0 && cut[len(cut)-1]&0xC0 == 0x80 {
		cut = cut[:len(cut)-1]
	}
	if len(cut) > 0 && cut[len(cut)-1] >= 0xC0 {
		cut = cut[:len(cut)-1]
	}
	return cut + "... [truncated]"
}
