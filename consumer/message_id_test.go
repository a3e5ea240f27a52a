package consumer_test

import (
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/stretchr/testify/require"
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
		fn      consumer.MessageIDSource
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
			got, err := tc.fn.MessageID(tc.msg)
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
	id, err := consumer.IDFromContentHash().MessageID(m)
	require.NoError(t, err)
	require.Equal(t, dedupe.FingerprintOf([]byte("ab"), []byte("c")).String(), id)
	require.Len(t, id, 64)
	other, _ := consumer.IDFromContentHash().MessageID(&consumer.Message{Key: []byte("a"), Value: []byte("bc")})
	require.NotEqual(t, id, other, "moving a byte between key and value changes the id")
}

func TestFingerprintIgnoresNilVersusEmptyKey(t *testing.T) {
	t.Parallel()
	require.Equal(t, dedupe.FingerprintOf(nil, []byte("v")), dedupe.FingerprintOf([]byte{}, []byte("v")))
	require.NotEqual(t, dedupe.FingerprintOf(nil, []byte("v")), dedupe.FingerprintOf(nil, []byte("w")))
}

// sampleMessages are messages every rule derives an id from, or fails on:
// two rules derive ids alike when they agree on all of them.
func sampleMessages() []*consumer.Message {
	return []*consumer.Message{
		{Topic: "orders", Partition: 1, Offset: 7, Key: []byte("k"), Value: []byte(`{"id":"j-1","meta":{"id":"m-1"}}`),
			Headers: []consumer.Header{{Key: "message-id", Value: []byte("h-1")}, {Key: "Idempotency-Key", Value: []byte("i-1")}, {Key: "a:b", Value: []byte("c-1")}}},
		{Topic: "orders", Partition: 2, Offset: 9, Value: []byte(`{"id":12}`)},
		{Topic: "other", Partition: 0, Offset: 0, Value: []byte(`not json`)},
	}
}

func derive(src consumer.MessageIDSource) []string {
	var out []string
	for _, m := range sampleMessages() {
		id, err := src.MessageID(m)
		if err != nil {
			id = "error: " + err.Error()
		}
		out = append(out, id)
	}
	return out
}

// Every built-in rule's text parses back to a rule with the same text
// that derives the same ids: what a consumer records is what the tools
// run.
func TestMessageIDRuleTextParsesBackToTheSameRule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rule consumer.MessageIDRule
		text string
	}{
		{consumer.IDFromHeader(""), "header:message-id"},
		{consumer.IDFromHeader("Idempotency-Key"), "header:Idempotency-Key"},
		{consumer.IDFromHeader("a:b"), "header:a:b"},
		{consumer.IDFromJSONField("id"), "json:id"},
		{consumer.IDFromJSONField("meta.id"), "json:meta.id"},
		{consumer.IDFromContentHash(), "hash"},
		{consumer.IDFromPosition(), "position"},
	} {
		require.Equal(t, tc.text, tc.rule.String())
		back, err := consumer.ParseMessageIDRule(tc.rule.String())
		require.NoError(t, err, tc.text)
		require.Equal(t, tc.rule, back, tc.text)
		require.Equal(t, tc.text, back.String())
		require.Equal(t, derive(tc.rule), derive(back), tc.text)
	}
	// The sample messages tell the rules apart, so the comparison above
	// would catch a rule parsed into another.
	require.NotEqual(t, derive(consumer.IDFromHeader("")), derive(consumer.IDFromJSONField("id")))
	require.NotEqual(t, derive(consumer.IDFromJSONField("id")), derive(consumer.IDFromJSONField("meta.id")))
	require.NotEqual(t, derive(consumer.IDFromContentHash()), derive(consumer.IDFromPosition()))
}

func TestParseMessageIDRuleReadsTheShortForms(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"header", "header:"} {
		r, err := consumer.ParseMessageIDRule(spec)
		require.NoError(t, err)
		require.Equal(t, consumer.IDFromHeader(consumer.DefaultMessageIDHeader), r, spec)
	}
}

func TestParseMessageIDRuleNamesTheBadTextAndTheForms(t *testing.T) {
	t.Parallel()
	for spec, want := range map[string]string{
		"":               `message id rule "" is not one of`,
		"uuid":           `message id rule "uuid" is not one of`,
		"Header:x":       `message id rule "Header:x" is not one of`,
		"json":           `message id rule "json": JSON field path "" has an empty field name`,
		"json:":          `message id rule "json:": JSON field path "" has an empty field name`,
		"json:meta.":     `JSON field path "meta." has an empty field name`,
		"hash:sha256":    `message id rule "hash:sha256": hash takes nothing after it`,
		"position:x":     `position takes nothing after it`,
		recordedCustom(): `names a function of the consumer's own`,
	} {
		_, err := consumer.ParseMessageIDRule(spec)
		require.ErrorContains(t, err, want, spec)
		require.ErrorContains(t, err, consumer.MessageIDRuleForms, spec)
	}
}

// recordedCustom is what a consumer records for a MessageIDFunc.
func recordedCustom() string { return "custom" }

func TestMessageIDFuncAdaptsAFunction(t *testing.T) {
	t.Parallel()
	var src consumer.MessageIDSource = consumer.MessageIDFunc(func(m *consumer.Message) (string, error) { return "f-" + string(m.Key), nil })
	id, err := src.MessageID(&consumer.Message{Key: []byte("k")})
	require.NoError(t, err)
	require.Equal(t, "f-k", id)
}

// New refuses the zero MessageIDRule ("derives no id") and takes a nil
// MessageIDFunc for the default ("it would otherwise panic on every
// message"), but takes a nil *MessageIDRule, which the MessageIDSource
// interface lets through and ruleOf handles only when non-nil: every
// message then panics in MessageID (a nil pointer dereference), the engine
// recovers it as an invalid id, and every message of the topic is set
// aside as a dead letter (invalid_id), none applied. The record says
// "custom", so audit also asks for --id.
func TestANilMessageIDRulePointerDeadLettersEveryMessage(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("n", 3)
	cfg := e.config(e.applyHandler())
	var rule *consumer.MessageIDRule
	cfg.MessageID = rule
	if _, err := consumer.New(e.db.Pool, cfg); err != nil {
		return // refused, as the zero rule is: fine
	}
	r := e.start(cfg)
	letters := func() int64 {
		return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE consumer = $1`, e.name)
	}
	waitFor(t, 30*time.Second, "every message settled", func() bool { return e.distinctEffects()+letters() >= int64(len(ids)) })
	r.stop()
	if n := letters(); n > 0 {
		t.Errorf("New accepted a nil *MessageIDRule, and %d of %d messages were dead-lettered for their ids (a nil MessageIDFunc is taken for the default header; the zero rule is refused)", n, len(ids))
	}
}
