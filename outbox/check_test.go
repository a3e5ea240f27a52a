package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// The outbox refuses, naming the field and the fix, a message it cannot
// store, before anything is sent: Postgres would refuse it in the middle
// of the caller's transaction, or JSON would rewrite a header name.
func TestOutboxRefusesWhatItCannotStore(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	box, err := outbox.New(db.Schema)
	require.NoError(t, err)
	ok := outbox.Message{ID: "ok-1", Destination: "email"}
	for name, tc := range map[string]struct {
		msgs []outbox.Message
		want string
	}{
		"no destination":              {[]outbox.Message{{ID: "x"}}, "outbox: Message.Destination must name a topic or a delivery function"},
		"destination not UTF-8":       {[]outbox.Message{{Destination: "e\xffmail"}}, "Message.Destination \"e\\xffmail\" is not valid UTF-8 or holds a NUL byte"},
		"id with a NUL byte":          {[]outbox.Message{ok, {ID: "a\x00b", Destination: "email"}}, "outbox: message 2 of 2: Message.ID \"a\\x00b\" is not valid UTF-8 or holds a NUL byte"},
		"header name not UTF-8":       {[]outbox.Message{{Destination: "email", Headers: []outbox.Header{{Key: "k\xfe", Value: []byte{0xff}}}}}, "Message.Headers: header name \"k\\xfe\""},
		"one id for two messages":     {[]outbox.Message{ok, ok}, `outbox: messages 1 and 2 both have ID "ok-1"`},
		"the fix is named, for an id": {[]outbox.Message{{ID: "\xc3", Destination: "email"}}, "hex- or base64-encode bytes"},
		"an id too long for the index": {[]outbox.Message{{ID: strings.Repeat("ab", outbox.MaxIDBytes/2) + "c", Destination: "email"}},
			"Message.ID is 1001 bytes, more than the 1000 the outbox's unique index of ids holds: derive a shorter id"},
	} {
		t.Run(name, func(t *testing.T) {
			_, werr := box.Write(context.Background(), db.Pool, tc.msgs...)
			require.ErrorContains(t, werr, tc.want)

			var queued int
			b := consumer.NewBatch(nil, nil, func(string, ...any) { queued++ })
			_, qerr := box.Queue(context.Background(), b, tc.msgs...)
			require.EqualError(t, qerr, werr.Error(), "Queue refuses it in the same words")
			require.Zero(t, queued, "nothing queued")
		})
	}
	require.Zero(t, pending(t, db), "nothing written")

	_, err = box.Write(context.Background(), db.Pool, outbox.Message{ID: strings.Repeat("ab", outbox.MaxIDBytes/2), Destination: "email"})
	require.NoError(t, err, "an id of MaxIDBytes is stored")
}
