package outbox

import (
	"sync"
	"time"
)

// budget caps retries at a share of recent successes, so a failing receiver
// gets a trickle of retries instead of every pending row retried at full
// speed. Each minute, retries are allowed up to min + ratio × successes.
type budget struct {
	mu        sync.Mutex
	ratio     float64
	min       int
	window    time.Time
	successes int
	retries   int
	now       func() time.Time
}

func newBudget(ratio float64, min int) *budget {
	return &budget{ratio: ratio, min: min, now: time.Now}
}

func (b *budget) roll() {
	if now := b.now(); now.Sub(b.window) >= time.Minute {
		b.window, b.successes, b.retries = now, 0, 0
	}
}

// success records a delivery that worked.
func (b *budget) success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.roll()
	b.successes++
}

// allowRetry spends a retry if the budget has one.
func (b *budget) allowRetry() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.roll()
	if float64(b.retries) >= float64(b.min)+b.ratio*float64(b.successes) {
		return false
	}
	b.retries++
	return true
}
