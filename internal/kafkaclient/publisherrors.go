package kafkaclient

import (
	"errors"
	"fmt"
)

// ErrTooLarge is wrapped by the error of a record refused for its size:
// by the client, before sending it, because RecordBytes passes
// MaxRecordBytes; or by the broker, as larger than the topic's
// max.message.bytes. A record the broker refused in a batch with others
// may fit alone; one refused alone never fits that topic as it is.
var ErrTooLarge = errors.New("kafkaclient: the record is too large for the topic")

// PublishErrors is the error of a Publish that wrote some of its records
// and not others (or none, each for a reason of its own): one entry per
// record, in the call's order, nil where the record was written and
// acknowledged. Its caller keeps what was written instead of publishing
// it again.
type PublishErrors []error

// Error says how many records were not written, and the first reason.
func (e PublishErrors) Error() string {
	n, first := 0, error(nil)
	for _, err := range e {
		if err != nil {
			n++
			if first == nil {
				first = err
			}
		}
	}
	return fmt.Sprintf("%d of %d records not written: %v", n, len(e), first)
}

// Unwrap returns the records' errors, so errors.Is finds any of them.
func (e PublishErrors) Unwrap() []error {
	var out []error
	for _, err := range e {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// TooLarge returns ErrTooLarge for a record of n bytes, for a client to
// refuse it before sending.
func TooLarge(n int) error {
	return fmt.Errorf("%w: %d bytes, more than the %d bytes a record may have (MaxRecordBytes)", ErrTooLarge, n, MaxRecordBytes)
}
