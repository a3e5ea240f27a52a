package deadletter

import (
	"encoding/json"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/pgtext"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Class says why a message was set aside. It is stored as text; the
// constants below are the classes kafkaonce writes (see
// kafkaoncetype.Class for each one's meaning).
type Class = kafkaoncetype.Class

const (
	ClassPermanent        = kafkaoncetype.ClassPermanent
	ClassPanic            = kafkaoncetype.ClassPanic
	ClassUndecodable      = kafkaoncetype.ClassUndecodable
	ClassData             = kafkaoncetype.ClassData
	ClassTxMisuse         = kafkaoncetype.ClassTxMisuse
	ClassInvalidID        = kafkaoncetype.ClassInvalidID
	ClassConflict         = kafkaoncetype.ClassConflict
	ClassRetriesExhausted = kafkaoncetype.ClassRetriesExhausted
	ClassCrashed          = kafkaoncetype.ClassCrashed
	ClassRetryLater       = kafkaoncetype.ClassRetryLater
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
	ID        int64  `json:"id"`
	Consumer  string `json:"consumer"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	Offset    int64  `json:"offset"`
	// MessageID is empty when no valid id could be derived.
	MessageID string   `json:"message_id"`
	Key       []byte   `json:"key"`
	Value     []byte   `json:"value"`
	Headers   []Header `json:"headers"`
	// MessageTime is the timestamp Kafka stored with the message.
	MessageTime time.Time `json:"message_time"`

	Class    Class  `json:"class"`
	Error    string `json:"error"`
	Attempts int    `json:"attempts"`

	FirstFailedAt  time.Time `json:"first_failed_at"`
	LastFailedAt   time.Time `json:"last_failed_at"`
	DeadLetteredAt time.Time `json:"dead_lettered_at"`
	// PublishedAt is set once the letter was published to the consumer's
	// dead-letter topic (if it has one).
	PublishedAt *time.Time `json:"published_at"`
	// RedrivenAt is set once a redrive applied the message.
	RedrivenAt *time.Time `json:"redriven_at"`
	// RedriveRequestedAt is set while an operator's redrive request waits
	// for the consumer; RedriveError says why the last requested redrive
	// failed.
	RedriveRequestedAt *time.Time `json:"redrive_requested_at"`
	RedriveError       string     `json:"redrive_error"`
	// SettledAt is set when an operator settled the letter instead of
	// redriving it (its effect was made by other means, or is not
	// wanted): it is then never redriven.
	SettledAt *time.Time `json:"settled_at"`
	// RetryAt is when the consumer tries a letter of class ClassRetryLater
	// again by itself (nil for any other letter, and once its retries ran
	// out); Retries counts the retries that failed.
	RetryAt *time.Time `json:"retry_at"`
	Retries int        `json:"retries"`
}

// MaxErrorLen bounds the stored error text; longer texts are cut, keeping
// the start (where the cause is) and saying how much was cut.
const MaxErrorLen = 16 << 10
