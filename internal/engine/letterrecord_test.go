package engine

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// A letter is cut to any limit its own headers leave room for, never past
// it, keeping first where it came from, then its error, key, headers and
// value; the markers say what was cut and the size before.
func TestALetterIsCutToFitItsLimit(t *testing.T) {
	t.Parallel()
	letter := func(key, value, header, errText int) *deadletter.Letter {
		return &deadletter.Letter{ID: 7, Consumer: "ledger", Topic: "orders", Partition: 3, Offset: 42, MessageID: "m-1",
			Key: bytes.Repeat([]byte("k"), key), Value: bytes.Repeat([]byte("v"), value),
			Headers: []deadletter.Header{{Key: "big", Value: bytes.Repeat([]byte("h"), header)}, {Key: "trace", Value: []byte("t")}},
			Class:   deadletter.ClassPermanent, Error: strings.Repeat("e", errText)}
	}
	get := func(r kafkaclient.Record, key string) (string, bool) {
		for _, h := range r.Headers {
			if h.Key == key {
				return string(h.Value), true
			}
		}
		return "", false
	}
	for _, c := range []struct {
		name                    string
		key, value, header, err int
		limit                   int
		cut                     string
		keepKey, keepBig        bool
	}{
		{name: "AWholeLetterThatFits", key: 3, value: 100, header: 10, err: 10, limit: 1000, keepKey: true, keepBig: true},
		{name: "ALargeValue", key: 3, value: 5000, header: 10, err: 10, limit: 2000, cut: "value", keepKey: true, keepBig: true},
		{name: "ALargeHeader", key: 3, value: 10, header: 5000, err: 10, limit: 2000, cut: "headers", keepKey: true},
		{name: "ALargeKey", key: 5000, value: 10, header: 10, err: 10, limit: 2000, cut: "key", keepBig: true},
		{name: "EverythingLarge", key: 5000, value: 5000, header: 5000, err: 1024, limit: 2000, cut: "key,headers,value", keepKey: false},
		{name: "ALimitUnderTheErrorText", key: 3, value: 10, header: 10, err: 1024, limit: 900, cut: "key,headers,value,error"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			lr := newLetterRecord(letter(c.key, c.value, c.header, c.err))
			rec, cut, err := lr.fit(c.limit, "too large")
			if err != nil {
				t.Fatal(err)
			}
			if got := kafkaclient.RecordBytes(&rec); got > c.limit {
				t.Fatalf("%d bytes, over the limit of %d", got, c.limit)
			}
			if strings.Join(cut, ",") != c.cut {
				t.Fatalf("cut %q, want %q", cut, c.cut)
			}
			marker, marked := get(rec, kafkaoncetype.HeaderTruncated)
			if c.cut == "" {
				if marked || rec.Value == nil || len(rec.Headers) != len(lr.whole.Headers) {
					t.Fatalf("a letter that fits is published whole: %v", rec.Headers)
				}
				return
			}
			if marker != c.cut {
				t.Fatalf("%s = %q, want %q", kafkaoncetype.HeaderTruncated, marker, c.cut)
			}
			if size, _ := get(rec, kafkaoncetype.HeaderOriginalSize); size != strconv.Itoa(lr.size) {
				t.Fatalf("%s = %q, want %d", kafkaoncetype.HeaderOriginalSize, size, lr.size)
			}
			for _, h := range []string{kafkaoncetype.HeaderSourceTopic, kafkaoncetype.HeaderSourcePartition, kafkaoncetype.HeaderSourceOffset, kafkaoncetype.HeaderErrorClass, kafkaoncetype.HeaderDeadLetterID, kafkaoncetype.HeaderTruncatedReason} {
				if _, ok := get(rec, h); !ok {
					t.Fatalf("no %s header", h)
				}
			}
			if _, ok := get(rec, "big"); ok != c.keepBig {
				t.Fatalf("the big header kept: %v, want %v", ok, c.keepBig)
			}
			if (len(rec.Key) > 0) != c.keepKey {
				t.Fatalf("the key kept: %v, want %v", len(rec.Key) > 0, c.keepKey)
			}
			if id, _ := get(rec, kafkaoncetype.DefaultMessageIDHeader); id != "m-1" {
				t.Fatalf("message id header %q", id)
			}
			if !bytes.HasPrefix(lr.l.Value, rec.Value) {
				t.Fatal("the value published is not the start of the letter's")
			}
		})
	}
	t.Run("ALimitUnderItsOwnHeaders", func(t *testing.T) {
		t.Parallel()
		lr := newLetterRecord(letter(3, 5000, 10, 10))
		if _, _, err := lr.fit(200, "too large"); err != errCannotFit {
			t.Fatalf("got %v, want errCannotFit", err)
		}
	})
	t.Run("AHugeMessageIDHeaderOfItsOwn", func(t *testing.T) {
		t.Parallel()
		l := letter(3, 10, 10, 10)
		l.MessageID = ""
		l.Headers = []deadletter.Header{{Key: kafkaoncetype.DefaultMessageIDHeader, Value: bytes.Repeat([]byte("i"), 5000)}}
		lr := newLetterRecord(l)
		rec, cut, err := lr.fit(2000, "too large")
		if err != nil || strings.Join(cut, ",") != "headers" {
			t.Fatalf("cut %q, err %v", cut, err)
		}
		var keys []string
		for _, h := range rec.Headers {
			keys = append(keys, h.Key)
		}
		if _, ok := get(rec, kafkaoncetype.DefaultMessageIDHeader); ok {
			t.Fatalf("the huge id header is kept: %v", keys)
		}
	})
}
