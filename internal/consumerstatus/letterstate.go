package consumerstatus

import (
	"fmt"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
)

// LetterState says where a dead letter stands, in the words the CLI's
// lists and the page share.
func LetterState(l *deadletter.Letter) string {
	switch {
	case l.RedrivenAt != nil:
		return "redriven " + l.RedrivenAt.UTC().Format(time.RFC3339)
	case l.SettledAt != nil:
		return "settled " + l.SettledAt.UTC().Format(time.RFC3339)
	case l.RedriveRequestedAt != nil:
		return "redrive requested"
	case l.RedriveError != "":
		return "redrive failed"
	case l.RetryAt != nil:
		return fmt.Sprintf("retry at %s (%d failed)", l.RetryAt.UTC().Format(time.RFC3339), l.Retries)
	default:
		return "pending"
	}
}
