package consumer

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/engine"
)

// MessageIDFunc derives the id under which a message is claimed: the dedupe
// key. Two deliveries of the same logical message must yield the same id,
// and two different messages different ids.
//
// Choose the id at the producer, once per logical message, before the first
// send attempt: an id regenerated on every retry makes each retry a "new"
// message and defeats deduplication. Time-ordered ids (UUIDv7, ULID, log
// positions) insert into a large processed_messages table much faster than
// random ones (UUIDv4), whose inserts touch every page of the index.
//
// An error, or an id that is empty, longer than MaxMessageIDLen, contains NUL
// or is not valid UTF-8, is ErrInvalidMessageID: the message cannot be
// claimed, and rather than retrying it forever or skipping it silently the
// consumer sets it aside by Config.OnPermanentFailure — in dead_letters
// (the default), or by stopping its partition at it (StopPartition).
type MessageIDFunc func(msg *Message) (string, error)

// DefaultMessageIDHeader is the header IDFromHeader reads when given no name,
// and the default source of message ids.
const DefaultMessageIDHeader = "message-id"

// MaxMessageIDLen is the longest accepted message id, in bytes. It leaves
// room for a log position (a topic name of up to 249 bytes plus partition
// and offset) while keeping index entries small.
const MaxMessageIDLen = 512

// IDFromHeader reads the id from the message header called name
// (DefaultMessageIDHeader when name is empty). A message without the header
// has an invalid id.
func IDFromHeader(name string) MessageIDFunc {
	if name == "" {
		name = DefaultMessageIDHeader
	}
	return func(msg *Message) (string, error) {
		v, ok := msg.Header(name)
		if !ok {
			return "", fmt.Errorf("no %q header (set it at the producer, or choose another Config.MessageID)", name)
		}
		return string(v), nil
	}
}

// IDFromJSONField reads the id from a field of a JSON object value. path is
// the field name, or names joined by dots for nested objects ("meta.id"). A
// string field is used as is; a number field by its literal text
// (12345678901234567890 stays exact). Any other type, a missing field or a
// value that is not a JSON object is an invalid id. Such a message never
// reaches the handler: it is set aside by Config.OnPermanentFailure (a
// dead letter of class invalid_id, by default), so a handler behind
// IDFromJSONField never sees a value that is not JSON.
func IDFromJSONField(path string) MessageIDFunc {
	fields := strings.Split(path, ".")
	return func(msg *Message) (string, error) {
		raw := json.RawMessage(msg.Value)
		for i, f := range fields {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
				return "", fmt.Errorf("JSON field %q: %s is not a JSON object", path, describeLevel(fields[:i]))
			}
			next, ok := obj[f]
			if !ok {
				return "", fmt.Errorf("JSON field %q is missing", path)
			}
			raw = next
		}
		raw = bytes.TrimSpace(raw)
		switch {
		case len(raw) > 0 && raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", fmt.Errorf("JSON field %q: %v", path, err)
			}
			return s, nil
		case len(raw) > 0 && (raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')):
			return string(raw), nil
		default:
			return "", fmt.Errorf("JSON field %q must be a string or a number, not %s", path, kindOf(raw))
		}
	}
}

func describeLevel(parents []string) string {
	if len(parents) == 0 {
		return "the message value"
	}
	return strconv.Quote(strings.Join(parents, "."))
}

func kindOf(raw []byte) string {
	switch {
	case len(raw) == 0:
		return "nothing"
	case raw[0] == '{':
		return "an object"
	case raw[0] == '[':
		return "an array"
	case raw[0] == 'n':
		return "null"
	default:
		return "a boolean"
	}
}

// IDFromContentHash uses the message's fingerprint, the hex SHA-256 of its
// key and value (see dedupe.FingerprintOf), as its id. Byte-identical
// messages are then one message: producer retries and redeliveries dedupe
// without any id at the producer. Use it only where two genuinely separate
// events can never have the same key and value (two identical transfers of
// 10 EUR from A to B would be applied once).
func IDFromContentHash() MessageIDFunc {
	return func(msg *Message) (string, error) {
		f := dedupe.FingerprintOf(msg.Key, msg.Value)
		return hex.EncodeToString(f[:]), nil
	}
}

// IDFromPosition uses the message's log position, "topic/partition/offset",
// as its id. It dedupes redeliveries, rebalances and rewinds of the same log,
// but not producer duplicates (each copy has its own offset), and the ids
// change if the topic is re-created or mirrored. Prefer an id set by the
// producer where you can.
func IDFromPosition() MessageIDFunc {
	return func(msg *Message) (string, error) { return msg.Position(), nil }
}

// ValidateMessageID checks the rules every message id must meet to be
// stored as a Postgres text key: not empty, at most MaxMessageIDLen bytes, no
// NUL, valid UTF-8. The error says which rule the id breaks.
func ValidateMessageID(id string) error { return engine.ValidateMessageID(id) }

// messageIDFunc is fn as the engine calls it (which checks what it
// returns, and recovers its panics).
func messageIDFunc(fn MessageIDFunc) func(*engine.Message) (string, error) {
	return func(msg *engine.Message) (string, error) { return fn((*Message)(msg)) }
}
