package kafkaclient

import (
	"errors"
	"fmt"
)

// ErrHeldBack is wrapped, with the error of the earlier record, by the
// error of a record Publish did not send because an earlier record of its
// key in the call failed: written, it would have gone ahead of that
// record once the caller sends it again.
var ErrHeldBack = errors.New("kafkaclient: not sent, so as not to go ahead of an earlier record of its key that failed")

// FailedKeys is, within one Publish call, the first error of each key
// whose record failed, so that a client holds back the key's later
// records (see Held). A nil key is no key: such records go to any
// partition, with no order to keep.
type FailedKeys map[string]error

// Fail notes that a record of key failed with err (its first failure is
// kept).
func (f FailedKeys) Fail(key []byte, err error) {
	if key == nil {
		return
	}
	if _, ok := f[string(key)]; !ok {
		f[string(key)] = err
	}
}

// Held returns the error of a record of key that must not be sent, since
// a record of its key failed before it (wrapping ErrHeldBack and that
// record's error), or nil.
func (f FailedKeys) Held(key []byte) error {
	if err, ok := f[string(key)]; ok && key != nil {
		return fmt.Errorf("%w: %w", ErrHeldBack, err)
	}
	return nil
}
