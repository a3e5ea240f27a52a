package consumer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/dedupe"
)

func TestMessageIDFunctions(t *testing.T) {
	t.Parallel()
	withHeader := func(k, v string) *consumer.Message {
		return &consumer.Message{Topic: "orders", Partition: 3, Offset: 42, Key: []byte("k"), Value: []byte(`{"id":"x"}`),
			Headers: []consumer.Header{{Key: k, Value: []byte(v)}}}
	}
	value := func(v string) *consumer.Message { return &consumer.Message{Value: []byte(v)} }
	cases := []struct {
		name    string
		fn      consumer.MessageIDFunc
		msg     *consumer.Message
		want    string
		wantErr string
	}{
		{"default header", consumer.IDFromHeader(""), withHeader("message-id", "abc"), "abc", ""},
		{"named header", consumer.IDFromHeader("Idempotency-Key"), withHeader("Idempotency-Key", "k-1"), "k-1", ""},
		{"missing header", consumer.IDFromHeader("Idempotency-Key"), withHeader("message-id", "abc"), "", `no "Idempotency-Key" header`},
		{"last header wins", consumer.IDFromHeader(""), &consumer.Message{Headers: []consumer.Header{{Key: "message-id", Value: []byte("old")}, {Key: "message-id", Value: []byte("new")}}}, "new", ""},
		{"json string", consumer.IDFromJSONField("id"), value(`{"id":"t-1","amount":5}`), "t-1", ""},
		{"json number stays exact", consumer.IDFromJSONField("id"), value(`{"id":12345678901234567890}`), "12345678901234567890", ""},
		{"json nested", consumer.IDFromJSONField("meta.event_id"), value(`{"meta":{"event_id":"e-9"}}`), "e-9", ""},
		{"json missing", consumer.IDFromJSONField("id"), value(`{"other":1}`), "", `JSON field "id" is missing`},
		{"json not object", consumer.IDFromJSONField("id"), value(`[1,2]`), "", "the message value is not a JSON object"},
		{"json nested not object", consumer.IDFromJSONField("meta.id"), value(`{"meta":"x"}`), "", `"meta" is not a JSON object`},
		{"json garbage", consumer.IDFromJSONField("id"), value(`{not json`), "", "not a JSON object"},
		{"json null", consumer.IDFromJSONField("id"), value(`{"id":null}`), "", "must be a string or a number, not null"},
		{"json object", consumer.IDFromJSONField("id"), value(`{"id":{}}`), "", "not an object"},
		{"position", consumer.IDFromPosition(), withHeader("", ""), "orders/3/42", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.fn(tc.msg)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestContentHashIDIsTheFingerprint(t *testing.T) {
	t.Parallel()
	m := &consumer.Message{Key: []byte("ab"), Value: []byte("c")}
	id, err := consumer.IDFromContentHash()(m)
	require.NoError(t, err)
	require.Equal(t, dedupe.FingerprintOf([]byte("ab"), []byte("c")).String(), id)
	require.Len(t, id, 64)
	other, _ := consumer.IDFromContentHash()(&consumer.Message{Key: []byte("a"), Value: []byte("bc")})
	require.NotEqual(t, id, other, "moving a byte between key and value changes the id")
}

func TestFingerprintIgnoresNilVersusEmptyKey(t *testing.T) {
	t.Parallel()
	require.Equal(t, dedupe.FingerprintOf(nil, []byte("v")), dedupe.FingerprintOf([]byte{}, []byte("v")))
	require.NotEqual(t, dedupe.FingerprintOf(nil, []byte("v")), dedupe.FingerprintOf(nil, []byte("w")))
}
