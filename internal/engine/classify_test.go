package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
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
	refused := fmt.Errorf("call partner: %w", &url.Error{Op: "Get", URL: "http://127.0.0.1:1/",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}})
	reset := fmt.Errorf("insert: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)})
	cases := []struct {
		name string
		err  error
		// lost: the transaction's connection broke (txAttempt.connLost).
		lost  bool
		class errClass
		kind  deadletter.Class
	}{
		{"plain error", errors.New("partner down"), false, classTransient, deadletter.ClassRetriesExhausted},
		{"permanent", permanent.Mark(errors.New("rejected")), false, classPermanent, deadletter.ClassPermanent},
		{"wrapped permanent", fmt.Errorf("ctx: %w", permanent.Mark(errors.New("x"))), false, classPermanent, deadletter.ClassPermanent},
		{"outbox permanent", outbox.Permanent(errors.New("rejected")), false, classPermanent, deadletter.ClassPermanent},
		{"wrapped outbox permanent", fmt.Errorf("relay: %w", outbox.Permanent(errors.New("x"))), false, classPermanent, deadletter.ClassPermanent},
		{"panic", fmt.Errorf("%w: boom", ErrHandlerPanicked), false, classPermanent, deadletter.ClassPanic},
		{"tx misuse", ErrTxControlledByConsumer, false, classPermanent, deadletter.ClassTxMisuse},
		{"json syntax", syntax, false, classPermanent, deadletter.ClassUndecodable},
		{"json type", fmt.Errorf("decode: %w", typeErr), false, classPermanent, deadletter.ClassUndecodable},
		{"untranslatable character 22021", pg("22021"), false, classPermanent, deadletter.ClassData},
		{"program limit 54000", pg("54000"), false, classPermanent, deadletter.ClassData},
		{"unique violation", pg("23505"), false, classPermanent, deadletter.ClassData},
		{"fk violation may pass", pg("23503"), false, classTransient, deadletter.ClassRetriesExhausted},
		{"undefined table (a deploy in progress)", pg("42P01"), false, classTransient, deadletter.ClassRetriesExhausted},
		{"serialization failure", pg("40001"), false, classInfra, ""},
		{"deadlock", pg("40P01"), false, classInfra, ""},
		{"admin shutdown", pg("57P01"), false, classInfra, ""},
		{"connection failure", pg("08006"), false, classInfra, ""},
		{"session ended (idle-in-transaction timeout)", fmt.Errorf("exec: %w", &pgconn.PgError{Code: "25P03", Severity: "FATAL"}), false, classInfra, ""},
		{"session ended, connection closed", fmt.Errorf("exec: %w", &pgconn.PgError{Code: "57P01", Severity: "FATAL"}), true, classInfra, ""},
		{"aborted tx", ErrTxAborted, false, classTransient, deadletter.ClassRetriesExhausted},
		{"timeout", fmt.Errorf("%w: 30s", ErrHandlerTimeout), false, classTransient, deadletter.ClassRetriesExhausted},
		{"context cancelled", context.Canceled, false, classTransient, deadletter.ClassRetriesExhausted},

		// Network errors are the database's only when the transaction's
		// connection broke; otherwise the handler's own call failed.
		{"eof, transaction's connection broken", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true, classInfra, ""},
		{"reset, transaction's connection broken", reset, true, classInfra, ""},
		{"closed, transaction's connection broken", fmt.Errorf("write: %w", net.ErrClosed), true, classInfra, ""},
		{"deadline on the transaction's query, connection broken", fmt.Errorf("select: %w", context.DeadlineExceeded), true, classInfra, ""},
		{"eof of the handler's own connection", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), false, classTransient, deadletter.ClassRetriesExhausted},
		{"reset of the handler's own connection", reset, false, classTransient, deadletter.ClassRetriesExhausted},
		{"HTTP call refused", refused, false, classTransient, deadletter.ClassRetriesExhausted},
		{"deadline of the handler's own context", fmt.Errorf("call partner: %w", context.DeadlineExceeded), false, classTransient, deadletter.ClassRetriesExhausted},
		// A broken connection makes no other failure the database's: pgx
		// also closes it for errors of its own making (an argument it
		// cannot encode), which are the message's.
		{"timeout, connection broken by the cancelled query", fmt.Errorf("%w: 30s", ErrHandlerTimeout), true, classTransient, deadletter.ClassRetriesExhausted},
		{"context cancelled, connection broken", context.Canceled, true, classTransient, deadletter.ClassRetriesExhausted},
		{"plain error, connection broken", errors.New("failed to encode args[0]"), true, classTransient, deadletter.ClassRetriesExhausted},
		{"permanent network error, connection broken", permanent.Mark(reset), true, classPermanent, deadletter.ClassPermanent},
		{"data error, connection broken", pg("22021"), true, classPermanent, deadletter.ClassData},
	}
	for _, tc := range cases {
		f := classifyHandlerError(tc.err, tc.lost)
		if f.class != tc.class || f.kind != tc.kind {
			t.Errorf("%s: got %v/%q, want %v/%q", tc.name, f.class, f.kind, tc.class, tc.kind)
		}
		if got, want := IsPermanent(tc.err), tc.class == classPermanent; got != want {
			t.Errorf("%s: IsPermanent is %v, want %v", tc.name, got, want)
		}
	}
	// The consumer's own statements: every network error is one of the
	// connection to Postgres.
	for _, err := range []error{reset, fmt.Errorf("read: %w", io.EOF), pg("57P03")} {
		if !isInfraError(err) {
			t.Errorf("isInfraError(%v) is false", err)
		}
	}
	if permanent.Mark(nil) != nil {
		t.Error("permanent.Mark(nil) must be nil")
	}
}
