package engine

import (
	"errors"
	"strconv"
	"strings"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// maxHeaderError bounds the error text carried in a header.
const maxHeaderError = 1024

// The parts of a letter that may be cut, in the order HeaderTruncated
// lists them.
const (
	cutKey     = "key"
	cutHeaders = "headers"
	cutValue   = "value"
	cutError   = "error"
)

// letterRecord is a letter as the dead-letter topic gets it, kept in its
// parts so that a letter too large for the topic can be cut to fit.
type letterRecord struct {
	l *deadletter.Letter
	// headers are the message's own, with DefaultMessageIDHeader and the
	// message id after them when the message lacks it.
	headers []kafkaoncetype.Header
	errText string
	// whole is the letter uncut, and size its RecordBytes.
	whole kafkaclient.Record
	size  int
}

func newLetterRecord(l *deadletter.Letter) *letterRecord {
	lr := &letterRecord{l: l}
	hasID := false
	for _, h := range l.Headers {
		lr.headers = append(lr.headers, kafkaoncetype.Header{Key: h.Key, Value: h.Value})
		hasID = hasID || h.Key == kafkaoncetype.DefaultMessageIDHeader
	}
	if !hasID && l.MessageID != "" {
		lr.headers = append(lr.headers, kafkaoncetype.Header{Key: kafkaoncetype.DefaultMessageIDHeader, Value: []byte(l.MessageID)})
	}
	lr.errText = l.Error
	if len(lr.errText) > maxHeaderError {
		lr.errText = lr.errText[:maxHeaderError]
	}
	lr.whole = lr.record(l.Key, l.Value, lr.headers, lr.errText, nil)
	lr.size = kafkaclient.RecordBytes(&lr.whole)
	return lr
}

// record assembles the letter from its parts, with markers (the headers
// saying what was cut) last.
func (lr *letterRecord) record(key, value []byte, headers []kafkaoncetype.Header, errText string, markers []kafkaoncetype.Header) kafkaclient.Record {
	l := lr.l
	m := kafkaclient.Record{Key: key, Value: value, Time: l.MessageTime}
	m.Headers = make([]kafkaoncetype.Header, 0, len(headers)+7+len(markers))
	m.Headers = append(m.Headers, headers...)
	m.Headers = append(m.Headers,
		kafkaoncetype.Header{Key: kafkaoncetype.HeaderConsumer, Value: []byte(l.Consumer)},
		kafkaoncetype.Header{Key: kafkaoncetype.HeaderSourceTopic, Value: []byte(l.Topic)},
		kafkaoncetype.Header{Key: kafkaoncetype.HeaderSourcePartition, Value: []byte(strconv.Itoa(l.Partition))},
		kafkaoncetype.Header{Key: kafkaoncetype.HeaderSourceOffset, Value: []byte(strconv.FormatInt(l.Offset, 10))},
		kafkaoncetype.Header{Key: kafkaoncetype.HeaderErrorClass, Value: []byte(l.Class)},
		kafkaoncetype.Header{Key: kafkaoncetype.HeaderError, Value: []byte(errText)},
		kafkaoncetype.Header{Key: kafkaoncetype.HeaderDeadLetterID, Value: []byte(strconv.FormatInt(l.ID, 10))},
	)
	m.Headers = append(m.Headers, markers...)
	return m
}

// markers are the headers of a cut letter.
func (lr *letterRecord) markers(cut []string, reason string) []kafkaoncetype.Header {
	return []kafkaoncetype.Header{
		{Key: kafkaoncetype.HeaderTruncated, Value: []byte(strings.Join(cut, ","))},
		{Key: kafkaoncetype.HeaderOriginalSize, Value: []byte(strconv.Itoa(lr.size))},
		{Key: kafkaoncetype.HeaderTruncatedReason, Value: []byte(reason)},
	}
}

// errCannotFit is returned by fit for a limit under what the letter's
// own headers take, cut as they may be.
var errCannotFit = errors.New("even the letter's own headers (where it came from, its id and class) take more")

// fit returns the letter whole when it is at most limit bytes
// (kafkaclient.RecordBytes), or else cut to fit, with cut naming what was
// cut and reason saying why in HeaderTruncatedReason. What it keeps, in
// this order while there is room: the letter's own headers (where the
// message came from, the letter's id and class), the message id header,
// the error text, the key, the message's other headers (each whole, in
// order, or left out) and as much of the value as fits. Everything is kept in dead_letters, and the letter's
// id header leads there.
func (lr *letterRecord) fit(limit int, reason string) (rec kafkaclient.Record, cut []string, err error) {
	if lr.size <= limit {
		return lr.whole, nil, nil
	}
	// The room left by what stays whatever is cut, the markers counted at
	// their longest.
	fixed := lr.record(nil, nil, nil, "", lr.markers([]string{cutKey, cutHeaders, cutValue, cutError}, reason))
	room := limit - kafkaclient.RecordBytes(&fixed)
	if room < 0 {
		return kafkaclient.Record{}, nil, errCannotFit
	}
	var cutK, cutH, cutV, cutE bool
	// The message id first (a valid one is at most 512 bytes), by which
	// readers of the topic know the message.
	keep := make([]bool, len(lr.headers))
	for i, h := range lr.headers {
		if n := kafkaclient.HeaderBytes(len(h.Key), len(h.Value)); h.Key == kafkaoncetype.DefaultMessageIDHeader && n <= room {
			keep[i], room = true, room-n
		}
	}
	errText := lr.errText
	if len(errText) > room {
		errText, cutE = errText[:room], true
	}
	room -= len(errText)
	key := lr.l.Key
	if len(key) > room {
		key, cutK = nil, true
	}
	room -= len(key)
	var headers []kafkaoncetype.Header
	for i, h := range lr.headers {
		if n := kafkaclient.HeaderBytes(len(h.Key), len(h.Value)); !keep[i] && h.Key != kafkaoncetype.DefaultMessageIDHeader && n <= room {
			keep[i], room = true, room-n
		}
		if keep[i] {
			headers = append(headers, h)
		} else {
			cutH = true
		}
	}
	value := lr.l.Value
	if len(value) > room {
		value, cutV = value[:room], true
	}
	for _, c := range []struct {
		did  bool
		name string
	}{{cutK, cutKey}, {cutH, cutHeaders}, {cutV, cutValue}, {cutE, cutError}} {
		if c.did {
			cut = append(cut, c.name)
		}
	}
	return lr.record(key, value, headers, errText, lr.markers(cut, reason)), cut, nil
}
