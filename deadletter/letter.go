package deadletter

import (
	"encoding/json"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/pgtext"
)

// Class says why a message was set aside. It is stored as text; these are
// the classes kafkaonce writes.
type Class string

const (
	// ClassPermanent: the handler returned consumer.Permanent(err).
	ClassPermanent Class = "permanent"
	// ClassPanic: the handler panicked (the stack is in Error).
	ClassPanic Class = "panic"
	// ClassUndecodable: the handler could not decode the payload (a JSON
	// syntax or type error).
	ClassUndecodable Class = "undecodable"
	// ClassData: Postgres rejected the data in a way that will not change
	// on retry (invalid text, out-of-range value, constraint violation).
	ClassData Class = "data"
	// ClassTxMisuse: the handler tried to commit or roll back the
	// consumer's transaction.
	ClassTxMisuse Class = "tx_misuse"
	// ClassInvalidID: no valid message id could be derived.
	ClassInvalidID Class = "invalid_id"
	// ClassConflict: the id was already claimed for different content.
	ClassConflict Class = "conflict"
	// ClassRetriesExhausted: the handler kept failing with errors that could
	// have been transient until MaxAttempts (or RetryMaxElapsed) ran out;
	// Error holds the last one.
	ClassRetriesExhausted Class = "retries_exhausted"
	// ClassCrashed: attempts of this message kept ending without a result
	// (the process died, or its connection did, while the handler ran).
	ClassCrashed Class = "crashed"
)

// Header is a message header as stored with a letter.
type Header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// headerJSON is how a header is stored: a key Postgres accepts in JSON as
// text, any other key (a NUL byte, invalid UTF-8) in base64, so that the
// letter keeps the message as it was.
type headerJSON struct {
	Key    string `json:"key,omitempty"`
	KeyB64 []byte `json:"key_b64,omitempty"`
	Value  []byte `json:"value"`
}

// MarshalJSON stores the key as text when it can, in key_b64 otherwise.
func (h Header) MarshalJSON() ([]byte, error) {
	j := headerJSON{Key: h.Key, Value: h.Value}
	if !pgtext.Storable(h.Key) {
		j.Key, j.KeyB64 = "", []byte(h.Key)
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads either form.
func (h *Header) UnmarshalJSON(b []byte) error {
	var j headerJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	h.Key, h.Value = j.Key, j.Value
	if j.KeyB64 != nil {
		h.Key = string(j.KeyB64)
	}
	return nil
}

// Letter is one dead-lettered message.
type Letter struct {
	ID        int64
	Consumer  string
	Topic     string
	Partition int
	Offset    int64
	// MessageID is empty when no valid id could be derived.
	MessageID string
	Key       []byte
	Value     []byte
	Headers   []Header
	// MessageTime is the timestamp Kafka stored with the message.
	MessageTime time.Time

	Class    Class
	Error    string
	Attempts int

	FirstFailedAt  time.Time
	LastFailedAt   time.Time
	DeadLetteredAt time.Time
	// PublishedAt is set once the letter was published to the consumer's
	// dead-letter topic (if it has one).
	PublishedAt *time.Time
	// RedrivenAt is set once a redrive applied the message.
	RedrivenAt *time.Time
	// RedriveRequestedAt is set while an operator's redrive request waits
	// for the consumer; RedriveError says why the last requested redrive
	// failed.
	RedriveRequestedAt *time.Time
	RedriveError       string
	// SettledAt is set when an operator settled the letter instead of
	// redriving it (its effect was made by other means, or is not
	// wanted): it is then never redriven.
	SettledAt *time.Time
}

// MaxErrorLen bounds the stored error text; longer texts are cut, keeping
// the start (where the cause is) and saying how much was cut.
const MaxErrorLen = 16 << 10
