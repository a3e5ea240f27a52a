// Package permanent is the one error class that says "retrying cannot fix
// this". consumer.Permanent and outbox.Permanent both mark errors with it,
// and both the consumer's and the relay's classifiers recognise it, so an
// error marked by either package is permanent to both.
package permanent

import "errors"

// Mark marks err as permanent. Mark(nil) is nil, and an error already
// marked at the top is returned as it is.
func Mark(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*markedError); ok {
		return err
	}
	return &markedError{err}
}

// Is reports whether err, or any error it wraps, was marked with Mark.
func Is(err error) bool {
	var m *markedError
	return errors.As(err, &m)
}

type markedError struct{ err error }

func (e *markedError) Error() string { return "permanent: " + e.err.Error() }
func (e *markedError) Unwrap() error { return e.err }
