package consumerstatus

import (
	"fmt"
	"strconv"

	"github.com/kafkaonce/kafkaonce/outbox"
)

// BacklogCount shows a count of outbox.Backlog, which stops at
// outbox.BacklogLimit: "100000 or more" there.
func BacklogCount(n int64) string {
	if n >= outbox.BacklogLimit {
		return fmt.Sprintf("%d or more", n)
	}
	return strconv.FormatInt(n, 10)
}
