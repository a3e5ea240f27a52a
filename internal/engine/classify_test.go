package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/permanent"
	"github.com/kafkaonce/kafkaonce/outbox"
)

func TestClassifyHandlerError(t *testing.T) {
	t.Parallel()
	var syntax error = json.Unmarshal([]byte("{"), &struct{}{})
	var typeErr error = json.Unmarshal([]byte(`{"a":"x"}`), &struct{ A int }{})
	pg := func(code string) error { return fmt.Errorf("exec: %w", &pgconn.PgError{Code: code}) }
	cases := []struct {
		name  string
		err   error
		class errClass
		kind  deadletter.Class
	}{
		{"plain error", errors.New("partner down"), classTransient, deadletter.ClassRetriesExhausted},
		{"permanent", permanent.Mark(errors.New("rejected")), classPermanent, deadletter.ClassPermanent},
		{"wrapped permanent", fmt.Errorf("ctx: %w", permanent.Mark(errors.New("x"))), classPermanent, deadletter.ClassPermanent},
		{"outbox permanent", outbox.Permanent(errors.New("rejected")), classPermanent, deadletter.ClassPermanent},
		{"wrapped outbox permanent", fmt.Errorf("relay: %w", outbox.Permanent(errors.New("x"))), classPermanent, deadletter.ClassPermanent},
		{"panic", fmt.Errorf("%w: boom", ErrHandlerPanicked), classPermanent, deadletter.ClassPanic},
		{"tx misuse", ErrTxControlledByConsumer, classPermanent, deadletter.ClassTxMisuse},
		{"json syntax", syntax, classPermanent, deadletter.ClassUndecodable},
		{"json type", fmt.Errorf("decode: %w", typeErr), classPermanent, deadletter.ClassUndecodable},
		{"untranslatable character 22021", pg("22021"), classPermanent, deadletter.ClassData},
		{"program limit 54000", pg("54000"), classPermanent, deadletter.ClassData},
		{"unique violation", pg("23505"), classPermanent, deadletter.ClassData},
		{"fk violation may pass", pg("23503"), classTransient, deadletter.ClassRetriesExhausted},
		{"undefined table (a deploy in progress)", pg("42P01"), classTransient, deadletter.ClassRetriesExhausted},
		{"serialization failure", pg("40001"), classInfra, ""},
		{"deadlock", pg("40P01"), classInfra, ""},
		{"admin shutdown", pg("57P01"), classInfra, ""},
		{"connection failure", pg("08006"), classInfra, ""},
		{"session ended (idle-in-transaction timeout)", fmt.Errorf("exec: %w", &pgconn.PgError{Code: "25P03", Severity: "FATAL"}), classInfra, ""},
		{"eof", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), classInfra, ""},
		{"aborted tx", ErrTxAborted, classTransient, deadletter.ClassRetriesExhausted},
		{"timeout", fmt.Errorf("%w: 30s", ErrHandlerTimeout), classTransient, deadletter.ClassRetriesExhausted},
		{"context cancelled", context.Canceled, classTransient, deadletter.ClassRetriesExhausted},
	}
	for _, tc := range cases {
		f := classifyHandlerError(tc.err)
		if f.class != tc.class || f.kind != tc.kind {
			t.Errorf("%s: got %v/%q, want %v/%q", tc.name, f.class, f.kind, tc.class, tc.kind)
		}
	}
	if permanent.Mark(nil) != nil {
		t.Error("permanent.Mark(nil) must be nil")
	}
}
