package kafkaclient

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Dials watches how connections to the brokers go, for every client of a
// consumer (or of the CLI) at once. A broker that cannot be reached is
// logged at WARN with its cause, once per cause: again when the cause
// changes, or when it fails again after a connection that worked; the
// clients retry every few seconds, and a log line each time would bury
// the one that says why. A broker reached again after failing is logged
// at INFO. Failing says, for the health report and the CLI, what the
// last failure was while one lasts. A nil *Dials watches nothing.
type Dials struct {
	log   *slog.Logger
	tlsOn bool

	mu      sync.Mutex
	brokers map[string]*DialFailure
	// connected is when a connection to any broker last worked.
	connected time.Time
}

// DialFailure is a broker's connections failing.
type DialFailure struct {
	Broker string
	Cause  DialCause
	// Err is the last attempt's error.
	Err error
	// Since is the first failed attempt in a row; At the last one.
	Since, At time.Time
	// Attempts counts the failed attempts in a row.
	Attempts int
	// logged is what was logged last of this run of failures.
	logged string
}

// NewDials returns a watch that logs to log (nil: nowhere), of clients
// that speak TLS when tlsOn.
func NewDials(log *slog.Logger, tlsOn bool) *Dials {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Dials{log: log, tlsOn: tlsOn, brokers: map[string]*DialFailure{}}
}

// Report records an attempt to connect to broker (host:port) and set the
// connection up: err nil when it worked. An attempt ended by the client's
// own closing or its caller's cancelling says nothing of the broker.
func (d *Dials) Report(broker string, err error) {
	if d == nil || errors.Is(err, context.Canceled) {
		return
	}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.brokers[broker]
	if err == nil {
		d.connected = now
		if f != nil {
			delete(d.brokers, broker)
			d.log.Info("kafka: connected to the broker again", slog.String("broker", broker), slog.Int("failed_attempts", f.Attempts),
				slog.Duration("failing_for", now.Sub(f.Since).Round(time.Millisecond)))
		}
		return
	}
	if f == nil {
		f = &DialFailure{Broker: broker, Since: now}
		d.brokers[broker] = f
	}
	f.Cause, f.Err, f.At = ClassifyDial(err, d.tlsOn), err, now
	f.Attempts++
	if key := f.key(); key != f.logged {
		f.logged = key
		d.log.Warn("kafka: cannot connect to the broker: "+f.Cause.Explain(), slog.String("broker", broker), slog.String("error", err.Error()))
	}
}

// key is what a log line is repeated for: the cause, or for an unknown
// one the innermost error, which holds no port number that changes with
// every attempt ("connection reset by peer", not "read tcp …:51234").
func (f *DialFailure) key() string {
	if f.Cause != DialFailed {
		return f.Cause.Explain()
	}
	inner := f.Err
	for {
		next := errors.Unwrap(inner)
		if next == nil {
			return inner.Error()
		}
		inner = next
	}
}

// Failing returns the last failure of a broker whose connections fail,
// nil when none does, or when a connection to any broker worked since: the
// brokers can be reached then. A failure is kept per address as dialed,
// and the address a client was given to start from (a load balancer, a
// DNS alias, "localhost") is often not the one the broker advertises,
// which the client dials from then on: a success there never clears the
// first address's failure, and only the time tells it is over.
func (d *Dials) Failing() *DialFailure {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var last *DialFailure
	for _, f := range d.brokers {
		if f.At.After(d.connected) && (last == nil || f.At.After(last.At)) {
			last = f
		}
	}
	if last == nil {
		return nil
	}
	cp := *last
	return &cp
}

// String says f for an operator: the cause, the broker, since when, and
// the error (alone, when the cause is not one ClassifyDial knows).
func (f *DialFailure) String() string {
	where := f.Broker + ", failing since " + f.Since.UTC().Format(time.RFC3339)
	if f.Cause == DialFailed {
		return f.Err.Error() + " (" + where + ")"
	}
	return f.Cause.Explain() + " (" + where + ": " + f.Err.Error() + ")"
}
