package devenv

import "context"

// Containers runs servers in containers: devenv.ContainerRuntime, whose
// docs say what each method promises, as this package calls it. This
// package runs no container itself, so that the library's module needs no
// Docker client; nil means no containers.
type Containers interface {
	Check(ctx context.Context) error
	StartPostgres(ctx context.Context, port int) (url string, remove func() error, err error)
	StartKafka(ctx context.Context, port int) (brokers []string, remove func() error, err error)
}

// SourceContainer is the Source of a server a Containers started.
const SourceContainer = "container"
