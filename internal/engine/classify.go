package engine

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/permanent"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// errClass says how a failure is retried.
type errClass uint8

const (
	// classTransient means the handler failed for a reason that may pass; the
	// message is retried alone with backoff, up to MaxAttempts.
	classTransient errClass = iota
	// classPermanent means retrying cannot help; the message is set aside at once.
	classPermanent
	// classInfra means the database or the connection failed, not the message;
	// the whole transaction runs again after a backoff, without counting an
	// attempt.
	classInfra
)

func (c errClass) String() string {
	switch c {
	case classPermanent:
		return "permanent"
	case classInfra:
		return "infrastructure"
	default:
		return "transient"
	}
}

// failure is what went wrong with one message.
type failure struct {
	class errClass
	// kind is the dead-letter class the failure leads to if the message is
	// set aside because of it.
	kind deadletter.Class
	err  error
	// attempts made so far, and when the first and the last failed.
	attempts    int
	first, last time.Time
	// uncounted means a transient failure inside a racing transaction that the
	// server had aborted, which may be the race's own lock timeout behind
	// an error the handler wrapped without %w; the message gets a try
	// alone, outside the race, before any failure of it counts (see
	// raceMayHaveFailed).
	uncounted bool
	// retryAfter is how long after the failure a message set aside with
	// kind ClassRetryLater is due again (see retryLater).
	retryAfter time.Duration
}

func newFailure(class errClass, kind deadletter.Class, err error) *failure {
	now := time.Now()
	return &failure{class: class, kind: kind, err: err, attempts: 1, first: now, last: now}
}

// IsPermanent reports whether a message whose handler call came to err is
// set aside at once, without retries (by Config.OnPermanentFailure). err is
// what the call comes to as a worker sees it, a panic, a timeout or a
// misuse of tx already turned into their errors by internal/usercall, as
// HandleAlone returns it. It is classifyHandlerError's verdict, so that
// consumer.IsPermanent, and a test of a handler through consumertest,
// answer what the workers do. Whether the transaction's connection broke
// changes only whether a failure that is not permanent counts an attempt,
// never whether it is permanent: it is left out.
func IsPermanent(err error) bool {
	return err != nil && classifyHandlerError(err, false).class == classPermanent
}

// classifyHandlerError sorts the error a handler's call came to. connLost
// says whether the connection of the call's transaction broke (see
// txAttempt.connLost): an error that looks like a failed network call is
// the database's only then. Otherwise it is the handler's own call that
// failed (a partner's API refusing connections, an http.Client timeout,
// the deadline of a context of the handler's), which counts as an attempt
// like any other failure that may pass. The error must say what it is: a
// handler that reports a broken connection in words of its own (%v, not
// %w) has its failure counted.
func classifyHandlerError(err error, connLost bool) *failure {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case permanent.Is(err):
		return newFailure(classPermanent, deadletter.ClassPermanent, err)
	case errors.Is(err, kafkaoncetype.ErrHandlerPanicked):
		return newFailure(classPermanent, deadletter.ClassPanic, err)
	case errors.Is(err, kafkaoncetype.ErrTxControlledByConsumer), errors.Is(err, kafkaoncetype.ErrRowsLeftOpen):
		return newFailure(classPermanent, deadletter.ClassTxMisuse, err)
	case errors.As(err, &syntax), errors.As(err, &typ):
		return newFailure(classPermanent, deadletter.ClassUndecodable, err)
	case isPermanentSQLError(err):
		return newFailure(classPermanent, deadletter.ClassData, err)
	case isInfraSQLError(err), connLost && isNetworkError(err):
		// Not any error once the connection is closed: pgx also closes
		// it for failures of its own making (an argument it cannot
		// encode in a batch), which are the message's.
		return newFailure(classInfra, "", err)
	default:
		return newFailure(classTransient, deadletter.ClassRetriesExhausted, err)
	}
}

// isPermanentSQLError reports errors Postgres will raise again for the same
// data (see sqlFaultOf): data exceptions (class 22: invalid text,
// out-of-range numbers, untranslatable characters), integrity violations
// (class 23) other than a missing foreign-key parent, which may simply not
// have arrived yet, and program limits (class 54: a value or row too
// large).
func isPermanentSQLError(err error) bool {
	f, ok := sqlFaultIn(err)
	return ok && f == faultMessages
}

// isInfraError reports failures of the database or the connection to it,
// for an error of the consumer's own statements, where every network
// error is one of the connection to Postgres: see isInfraSQLError and
// isNetworkError.
func isInfraError(err error) bool { return isInfraSQLError(err) || isNetworkError(err) }

// isInfraSQLError reports the errors Postgres raises for itself rather
// than for the message, whatever statement raised them (see sqlFaultOf):
// the database out of resources (class 53: a full disk), shutting down or
// refusing connections (57), failing (58, XX), a session it ended, and a
// transaction that lost a race (serialisation failures, deadlocks and
// lock timeouts: it should simply run again; see isContention).
func isInfraSQLError(err error) bool {
	f, ok := sqlFaultIn(err)
	return ok && f == faultDatabases
}

// isNetworkError reports errors that look like a failed network call: a
// net.Error (which includes context.DeadlineExceeded, a *url.Error of a
// failed HTTP call, and pgx's timeouts), an EOF, a closed connection, or
// a call pgx refused before sending anything. Whose network call failed
// the error does not say.
func isNetworkError(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err)
}
