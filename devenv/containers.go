package devenv

import (
	"context"
	"log"
)

// ContainerRuntime runs Postgres and Kafka in containers. devenv runs none
// itself, so that a module that uses devenv gets no Docker client in its
// go.mod: the module github.com/kafkaonce/kafkaonce/devenv/containers
// provides one over testcontainers-go. Pass it with WithContainers.
type ContainerRuntime interface {
	// Check reports whether containers can run here. It answers within a
	// bound of its own, also when the engine hangs; its error says why
	// not, for the line that says containers were skipped.
	Check(ctx context.Context) error
	// StartPostgres runs a Postgres server published on 127.0.0.1:port (0:
	// a free port) and returns a superuser's URL and a function that
	// removes the container.
	StartPostgres(ctx context.Context, port int) (url string, remove func() error, err error)
	// StartKafka runs a Kafka broker listening on 127.0.0.1:port (0: a free
	// port) and returns its bootstrap addresses and a function that
	// removes the container.
	StartKafka(ctx context.Context, port int) (brokers []string, remove func() error, err error)
}

// An Option changes how Start finds or starts its servers.
type Option func(*options)

type options struct {
	containers ContainerRuntime
	logf       func(format string, args ...any)
}

func newOptions(opts []Option) *options {
	o := &options{logf: log.Printf}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// WithContainers lets Start run servers in containers of rt: Kafka
// whenever KAFKA_BROKERS is unset (a real broker rather than the
// in-process one), Postgres when DATABASE_URL is unset and no local server
// binaries are installed. When rt's check fails, Start logs one line
// saying why containers were skipped and goes on without them.
func WithContainers(rt ContainerRuntime) Option {
	return func(o *options) { o.containers = rt }
}

// WithLogf sends Start's lines to logf (such as testing.T.Logf) instead of
// the standard logger: today, the one saying why containers were skipped.
func WithLogf(logf func(format string, args ...any)) Option {
	return func(o *options) { o.logf = logf }
}

// checkedContainers is o's runtime once its check passed, else nil, with
// the line that says why containers were skipped.
func (o *options) checkedContainers(ctx context.Context) ContainerRuntime {
	if o.containers == nil {
		return nil
	}
	if err := o.containers.Check(ctx); err != nil {
		o.logf("devenv: %v; Postgres from DATABASE_URL or the local binaries, Kafka from KAFKA_BROKERS or in the process", err)
		return nil
	}
	return o.containers
}
