package outbox

import "time"

// SetAfterDeliver installs a function run between delivering and recording
// a round (tests simulate a crash there).
func (r *Relay) SetAfterDeliver(f func()) { r.afterDeliver = f }

// NewTestBudget exposes the retry budget with a fake clock.
func NewTestBudget(ratio float64, min int, now func() time.Time) (success func(), allow func() bool) {
	b := newBudget(ratio, min)
	b.now = now
	return b.success, b.allowRetry
}

// BucketOf is the bucket a key hashes to.
func BucketOf(key []byte) int32 { return bucketOf(key) }
