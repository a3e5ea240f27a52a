package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/kafkaonce/kafkaonce/internal/pgcluster"
)

// Postgres is a reachable Postgres server.
type Postgres struct {
	// URL connects to a database on the server as a superuser.
	URL string
	// Source says where the server came from: "DATABASE_URL", "docker" or
	// "local binaries".
	Source string
	// Cluster is set when the server is a throwaway local cluster, so callers
	// can restart it to inject faults.
	Cluster *pgcluster.Cluster
	close   func() error
}

// Close stops the server if this package started it.
func (p *Postgres) Close() error {
	if p.close == nil {
		return nil
	}
	return p.close()
}

// PostgresOrder says which sources StartPostgres tries after DATABASE_URL.
type PostgresOrder int

const (
	// DockerFirst tries a container before the local binaries (tests: the
	// container is the same everywhere).
	DockerFirst PostgresOrder = iota
	// LocalFirst tries the local binaries before a container (examples:
	// faster to start and no image to pull).
	LocalFirst
)

// StartPostgres returns DATABASE_URL's server, or starts one. The error of a
// machine with none of the options says what to install or set.
func StartPostgres(ctx context.Context, order PostgresOrder) (*Postgres, error) {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		return &Postgres{URL: url, Source: "DATABASE_URL"}, nil
	}
	tries := []func(context.Context) (*Postgres, error){postgresDocker, postgresLocal}
	if order == LocalFirst {
		tries[0], tries[1] = tries[1], tries[0]
	}
	var errs []error
	for _, try := range tries {
		p, err := try(ctx)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("devenv: no Postgres: set DATABASE_URL to a server you can create schemas on, install PostgreSQL server binaries (initdb, pg_ctl), or start Docker: %w", errors.Join(errs...))
}

var errNoDocker = errors.New("devenv: Docker is not available")

func postgresLocal(ctx context.Context) (*Postgres, error) {
	c, err := pgcluster.Start(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &Postgres{URL: c.URL(), Source: "local binaries", Cluster: c, close: c.Stop}, nil
}

func postgresDocker(ctx context.Context) (*Postgres, error) {
	if !DockerAvailable() {
		return nil, errNoDocker
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        "postgres:15-alpine",
			ExposedPorts: []string{"5432/tcp"},
			Env:          map[string]string{"POSTGRES_PASSWORD": "postgres", "POSTGRES_HOST_AUTH_METHOD": "trust"},
			Cmd:          []string{"postgres", "-c", "fsync=off", "-c", "max_connections=300"},
			WaitingFor:   wait.ForListeningPort("5432/tcp").WithStartupTimeout(2 * time.Minute),
		},
		Started: true,
	})
	if err != nil {
		return nil, fmt.Errorf("devenv: start Postgres container: %w", err)
	}
	host, err := c.Host(ctx)
	if err != nil {
		_ = c.Terminate(context.Background())
		return nil, err
	}
	port, err := c.MappedPort(ctx, "5432/tcp")
	if err != nil {
		_ = c.Terminate(context.Background())
		return nil, err
	}
	url := fmt.Sprintf("postgres://postgres@%s:%s/postgres?sslmode=disable", host, port.Port())
	return &Postgres{URL: url, Source: "docker", close: func() error { return c.Terminate(context.Background()) }}, nil
}
