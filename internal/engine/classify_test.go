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
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/permanent"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
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
		{"panic", fmt.Errorf("%w: boom", kafkaoncetype.ErrHandlerPanicked), false, classPermanent, deadletter.ClassPanic},
		{"tx misuse", kafkaoncetype.ErrTxControlledByConsumer, false, classPermanent, deadletter.ClassTxMisuse},
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
		{"aborted tx", kafkaoncetype.ErrTxAborted, false, classTransient, deadletter.ClassRetriesExhausted},
		{"timeout", fmt.Errorf("%w: 30s", kafkaoncetype.ErrHandlerTimeout), false, classTransient, deadletter.ClassRetriesExhausted},
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
		{"timeout, connection broken by the cancelled query", fmt.Errorf("%w: 30s", kafkaoncetype.ErrHandlerTimeout), true, classTransient, deadletter.ClassRetriesExhausted},
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

// Every SQLSTATE class of PostgreSQL's table, through the classification
// a handler's error gets: the database's (retried without counting), the
// message's (set aside at once), or the handler's (counted). The codes
// are what each class raises in practice, and the exceptions within a
// class.
func TestEverySQLStateClassIsSorted(t *testing.T) {
	t.Parallel()
	const (
		db      = classInfra
		message = classPermanent
		handler = classTransient
	)
	cases := []struct {
		code  string
		class errClass
	}{
		{"00000", handler}, {"01000", handler}, {"02000", handler}, {"03000", handler},
		{"08000", db}, {"08003", db}, {"08006", db}, {"08P01", db},
		{"09000", handler}, {"0A000", handler}, {"0B000", handler}, {"0F000", handler},
		{"0L000", handler}, {"0P000", handler}, {"0Z000", handler}, {"20000", handler},
		{"21000", handler},
		{"22001", message}, {"22003", message}, {"22021", message}, {"22P02", message},
		{"23502", message}, {"23505", message}, {"23514", message}, {"23P01", message},
		{"23503", handler}, // its parent may not have arrived yet
		{"24000", handler},
		{"25001", handler}, {"25P02", handler},
		{"25006", handler},           // once the batch wrote, only a handler can have made it read only; a standby fails the begin
		{"25P03", db}, {"25P04", db}, // the session ended
		{"26000", handler}, {"27000", handler},
		{"28000", handler}, {"28P01", handler}, // a login of the handler's own connection
		{"2B000", handler}, {"2D000", handler}, {"2F005", handler}, {"34000", handler},
		{"38000", handler}, {"39000", handler}, {"3B001", handler},
		{"3D000", handler},
		{"3F000", handler},
		{"40000", db}, {"40001", db}, {"40003", db}, {"40P01", db},
		{"40002", message},
		{"42501", handler}, {"42601", handler}, {"42P01", handler}, {"42703", handler},
		{"44000", message},
		{"53000", db}, {"53100", db}, {"53200", db}, {"53300", db},
		{"53400", handler}, // temp_file_limit: a bound on the statement
		{"54000", message}, {"54001", message}, {"54011", message}, {"54023", message},
		{"55000", handler}, {"55006", handler},
		{"55P03", db}, // a lock wait lost a race
		{"57000", db}, {"57P01", db}, {"57P02", db}, {"57P03", db}, {"57P04", db}, {"57P05", db},
		{"57014", handler}, // StatementTimeout
		{"58000", db}, {"58030", db}, {"58P01", db},
		{"72000", db},
		{"F0000", db}, {"F0001", db},
		{"HV000", handler}, {"HV00N", handler},
		{"P0000", handler}, {"P0001", handler}, {"P0004", handler},
		{"XX000", db}, {"XX001", db}, {"XX002", db},
		{"KO003", handler}, // a class of no one's table: a trigger of the user's
	}
	for _, tc := range cases {
		t.Run(tc.code, func(t *testing.T) {
			err := fmt.Errorf("exec: %w", &pgconn.PgError{Code: tc.code, Severity: "ERROR", SeverityUnlocalized: "ERROR"})
			require.Equal(t, tc.class, classifyHandlerError(err, false).class)
			require.Equal(t, tc.class == db, isInfraError(err), "as the consumer's own statement's error")
		})
	}
	for _, severity := range []string{"FATAL", "PANIC"} {
		for _, code := range []string{"XX000", "22021", "42601", "57014"} {
			err := &pgconn.PgError{Code: code, Severity: severity, SeverityUnlocalized: severity}
			require.Equal(t, db, classifyHandlerError(err, false).class, "%s %s ends the session: the database's", severity, code)
		}
	}
	// Every class of the table is named, so that a new code of a known
	// class is sorted as its class is.
	for _, tc := range cases {
		if tc.code[:2] != "KO" {
			_, ok := sqlClassFaults[tc.code[:2]]
			require.True(t, ok, "class %s is not in sqlClassFaults", tc.code[:2])
		}
	}
}
