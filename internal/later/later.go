// Package later is the mark of an error that asks for its message to be
// set aside and tried again after a while (consumer.RetryLater), instead
// of holding its partition while it is retried in place.
package later

import (
	"errors"
	"time"
)

// Mark marks err as one to retry after d. Mark(nil, d) is nil.
func Mark(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &markedError{err: err, after: d}
}

// After reports the delay err, or an error it wraps, asks for.
func After(err error) (time.Duration, bool) {
	var m *markedError
	if errors.As(err, &m) {
		return m.after, true
	}
	return 0, false
}

type markedError struct {
	err   error
	after time.Duration
}

func (e *markedError) Error() string { return "retry later: " + e.err.Error() }
func (e *markedError) Unwrap() error { return e.err }
