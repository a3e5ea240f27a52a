package consumer

import (
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// errClass says how a failure is retried.
type errClass uint8

const (
	// classTransient: the handler failed for a reason that may pass; the
	// message is retried alone with backoff.
	classTransient errClass = iota
	// classPermanent: retrying cannot help; the partition stops at the
	// message.
	classPermanent
	// classInfra: the database or the connection failed, not the message;
	// the whole transaction runs again after a backoff.
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

// classify sorts a handler's error.
func classify(err error) errClass {
	switch {
	case errors.Is(err, ErrTxControlledByConsumer), errors.Is(err, ErrHandlerPanicked):
		return classPermanent
	case isInfraError(err):
		return classInfra
	default:
		return classTransient
	}
}

// isInfraError reports failures of the database or the connection to it
// rather than of the message: serialisation failures and deadlocks (the
// transaction lost a race and should simply run again), the server shutting
// down, and connections that broke.
func isInfraError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", // serialization_failure
			"40P01", // deadlock_detected
			"57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03": // cannot_connect_now
			return true
		}
		return pgErr.Code[:2] == "08" // connection_exception
	}
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || pgconn.Timeout(err)
}
