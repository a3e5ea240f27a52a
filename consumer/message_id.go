package consumer

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kafkaonce/kafkaonce/consumer/settings"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// MessageIDSource derives the id under which a message is claimed: the
// dedupe key. Two deliveries of the same logical message must yield the
// same id, and two different messages different ids.
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
//
// The built-in sources are MessageIDRules (IDFromHeader, IDFromJSONField,
// IDFromContentHash, IDFromPosition): they can say how they derive ids, and
// a consumer records that when it starts, so that kafkaonce's tools derive
// ids the same way without being told. A function of your own
// (MessageIDFunc) cannot: tools must then be given the rule (kafkaonce
// audit --id).
type MessageIDSource = settings.MessageIDSource

// MessageIDFunc adapts a function to MessageIDSource, for ids that no
// MessageIDRule derives. A consumer records its id derivation as "custom",
// and kafkaonce audit then needs --id.
type MessageIDFunc func(msg *Message) (string, error)

// MessageID calls f(msg).
func (f MessageIDFunc) MessageID(msg *Message) (string, error) { return f(msg) }

// DefaultMessageIDHeader is the header IDFromHeader reads when given no name,
// and the default source of message ids.
const DefaultMessageIDHeader = kafkaoncetype.DefaultMessageIDHeader

// MaxMessageIDLen is the longest accepted message id, in bytes.
const MaxMessageIDLen = kafkaoncetype.MaxMessageIDLen

// MessageIDRuleForms lists the forms of a MessageIDRule's text, as
// ParseMessageIDRule accepts them and kafkaonce's --id flag takes them.
const MessageIDRuleForms = "header:<name>, json:<field.path>, hash, position"

// The kinds of MessageIDRule, as their text begins.
const (
	ruleHeader   = "header"
	ruleJSON     = "json"
	ruleHash     = "hash"
	rulePosition = "position"
)

// A MessageIDRule is a built-in MessageIDSource that says how it derives
// ids: IDFromHeader, IDFromJSONField, IDFromContentHash and IDFromPosition
// return one. Its String is its text in MessageIDRuleForms
// ("header:message-id", "json:meta.id", "hash", "position"), which
// ParseMessageIDRule turns back into the same rule. A consumer records that
// text when it starts, and kafkaonce audit reads it, so that the tools and
// the consumer derive the same ids. The zero MessageIDRule derives none
// (New refuses it).
type MessageIDRule struct {
	kind string
	// arg is the header name or the JSON field path.
	arg string
	// fields is the path split at its dots.
	fields []string
}

// IDFromHeader reads the id from the message header called name
// (DefaultMessageIDHeader when name is empty). A message without the header
// has an invalid id.
func IDFromHeader(name string) MessageIDRule {
	if name == "" {
		name = DefaultMessageIDHeader
	}
	return MessageIDRule{kind: ruleHeader, arg: name}
}

// IDFromJSONField reads the id from a field of a JSON object value. path is
// the field name, or names joined by dots for nested objects ("meta.id").
// A string field is used as is; a number field by its literal text
// (12345678901234567890 stays exact). Any other type, a missing field or a
// value that is not a JSON object is an invalid id. Such a message never
// reaches the handler: it is set aside by Config.OnPermanentFailure (a
// dead letter of class invalid_id, by default), so a handler behind
// IDFromJSONField never sees a value that is not JSON. A path that is
// empty or has an empty name ("meta..id") is refused by New.
func IDFromJSONField(path string) MessageIDRule {
	return MessageIDRule{kind: ruleJSON, arg: path, fields: strings.Split(path, ".")}
}

// IDFromContentHash uses the message's fingerprint, the hex SHA-256 of its
// key and value (see dedupe.FingerprintOf), as its id. Byte-identical
// messages are then one message: producer retries and redeliveries dedupe
// without any id at the producer. Use it only where two genuinely separate
// events can never have the same key and value (two identical transfers of
// 10 EUR from A to B would be applied once).
func IDFromContentHash() MessageIDRule { return MessageIDRule{kind: ruleHash} }

// IDFromPosition uses the message's log position, "topic/partition/offset",
// as its id. It dedupes redeliveries, rebalances and rewinds of the same log,
// but not producer duplicates (each copy has its own offset), nor a topic
// mirrored elsewhere. A topic deleted and re-created starts its offsets at 0
// again, so its messages repeat the old ones' ids: run
// offsets.Store.TopicRecreated before a consumer starts on it, which
// retires the old ids. Prefer an id set by the producer where you can.
func IDFromPosition() MessageIDRule { return MessageIDRule{kind: rulePosition} }

// ParseMessageIDRule returns the rule whose text is spec, one of
// MessageIDRuleForms: "header:<name>" (a bare "header" reads
// DefaultMessageIDHeader), "json:<field.path>", "hash" or "position". For
// every rule r, ParseMessageIDRule(r.String()) derives the same ids as r.
// The error names spec and lists the forms.
func ParseMessageIDRule(spec string) (MessageIDRule, error) {
	kind, arg, hasArg := strings.Cut(spec, ":")
	var r MessageIDRule
	switch kind {
	case ruleHeader:
		r = IDFromHeader(arg)
	case ruleJSON:
		r = IDFromJSONField(arg)
	case ruleHash, rulePosition:
		if hasArg {
			return MessageIDRule{}, fmt.Errorf("message id rule %q: %s takes nothing after it; the forms are %s", spec, kind, MessageIDRuleForms)
		}
		r = MessageIDRule{kind: kind}
	case "custom":
		// What a consumer records for a MessageIDFunc.
		return MessageIDRule{}, fmt.Errorf("message id rule %q names a function of the consumer's own, which no tool can run; give the rule it follows, one of %s", spec, MessageIDRuleForms)
	default:
		return MessageIDRule{}, fmt.Errorf("message id rule %q is not one of %s", spec, MessageIDRuleForms)
	}
	if err := r.check(); err != nil {
		return MessageIDRule{}, fmt.Errorf("message id rule %q: %w; the forms are %s", spec, err, MessageIDRuleForms)
	}
	return r, nil
}

// String returns the rule's text, which ParseMessageIDRule reads back:
// "header:<name>", "json:<field.path>", "hash" or "position" ("" for the
// zero MessageIDRule).
func (r MessageIDRule) String() string {
	switch r.kind {
	case ruleHeader, ruleJSON:
		return r.kind + ":" + r.arg
	default:
		return r.kind
	}
}

// check reports a rule that cannot derive ids: the zero one, or a JSON
// path with an empty field name.
func (r MessageIDRule) check() error {
	switch r.kind {
	case "":
		return errors.New("is the zero MessageIDRule, which derives no id: use IDFromHeader, IDFromJSONField, IDFromContentHash or IDFromPosition")
	case ruleJSON:
		if slices.Contains(r.fields, "") {
			return fmt.Errorf("JSON field path %q has an empty field name: give names joined by dots, such as \"id\" or \"meta.id\"", r.arg)
		}
	}
	return nil
}

// MessageID derives msg's id by the rule.
func (r MessageIDRule) MessageID(msg *Message) (string, error) {
	switch r.kind {
	case ruleHeader:
		v, ok := msg.Header(r.arg)
		if !ok {
			return "", fmt.Errorf("no %q header", r.arg)
		}
		return string(v), nil
	case ruleJSON:
		return jsonField(r.arg, r.fields, msg.Value)
	case ruleHash:
		f := dedupe.FingerprintOf(msg.Key, msg.Value)
		return hex.EncodeToString(f[:]), nil
	case rulePosition:
		return msg.Position(), nil
	}
	return "", r.check()
}

// jsonField reads the field at path (split into fields) of a JSON object
// value, as IDFromJSONField says.
func jsonField(path string, fields []string, value []byte) (string, error) {
	raw := json.RawMessage(value)
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

// ValidateMessageID checks the rules every message id must meet to be
// stored as a Postgres text key: not empty, at most MaxMessageIDLen bytes, no
// NUL, valid UTF-8. The error says which rule the id breaks.
func ValidateMessageID(id string) error { return engine.ValidateMessageID(id) }

// ruleOf returns the MessageIDRule src is, if it is one.
func ruleOf(src MessageIDSource) (MessageIDRule, bool) {
	switch r := src.(type) {
	case MessageIDRule:
		return r, true
	case *MessageIDRule:
		if r != nil {
			return *r, true
		}
	}
	return MessageIDRule{}, false
}

// messageIDFunc is src as the engine calls it (which checks what it
// returns, and recovers its panics).
func messageIDFunc(src MessageIDSource) func(*Message) (string, error) { return src.MessageID }

// ruleText is the text a consumer records for src: the rule's, or "" for
// a source that cannot say how it derives ids (the engine records that as
// custom).
func ruleText(src MessageIDSource) string {
	if r, ok := ruleOf(src); ok {
		return r.String()
	}
	return ""
}
