package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

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

// StartPostgresOn starts a server of its own listening on 127.0.0.1:port,
// whatever DATABASE_URL says: from the local binaries, else in a
// container. It is for servers that outlive the processes using them
// (kafkaonce dev).
func StartPostgresOn(ctx context.Context, port int) (*Postgres, error) {
	p, err := postgresLocalOn(ctx, port)
	if err == nil {
		return p, nil
	}
	if !DockerAvailable() {
		return nil, fmt.Errorf("devenv: no Postgres on port %d: install PostgreSQL server binaries (initdb, pg_ctl), or start Docker: %w", port, errors.Join(err, errNoDocker))
	}
	return postgresContainerOn(ctx, port)
}

func postgresLocal(ctx context.Context) (*Postgres, error) { return postgresLocalOn(ctx, 0) }

// postgresLocalOn starts a throwaway cluster at port (0: a free one).
func postgresLocalOn(ctx context.Context, port int) (*Postgres, error) {
	var settings map[string]string
	if port > 0 {
		settings = map[string]string{"port": strconv.Itoa(port)}
	}
	c, err := pgcluster.Start(ctx, settings)
	if err != nil {
		return nil, err
	}
	return &Postgres{URL: c.URL(), Source: "local binaries", Cluster: c, close: c.Stop}, nil
}

func postgresDocker(ctx context.Context) (*Postgres, error) {
	if !DockerAvailable() {
		return nil, errNoDocker
	}
	return postgresContainerOn(ctx, 0)
}

// postgresContainerOn runs postgres:15-alpine with its port published on
// loopback at port (0: a free one), and waits until it accepts
// connections.
func postgresContainerOn(ctx context.Context, port int) (*Postgres, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	publish := "127.0.0.1::5432"
	if port > 0 {
		publish = fmt.Sprintf("127.0.0.1:%d:5432", port)
	}
	c, err := runContainer(ctx,
		[]string{"--publish", publish, "--env", "POSTGRES_HOST_AUTH_METHOD=trust"},
		"postgres:15-alpine", "postgres", "-c", "fsync=off", "-c", "max_connections=300")
	if err != nil {
		return nil, fmt.Errorf("devenv: start Postgres container: %w", err)
	}
	addr, err := c.hostAddr(ctx, "5432/tcp")
	if err != nil {
		_ = c.remove()
		return nil, fmt.Errorf("devenv: Postgres container: %w", err)
	}
	url := "postgres://postgres@" + addr + "/postgres?sslmode=disable"
	// The image's entrypoint initialises the database behind a server that
	// listens on no TCP port, then restarts it: a connection over TCP that
	// answers a query is the real server.
	err = waitReady(ctx, 2*time.Minute, "Postgres container", func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		return conn.Ping(ctx)
	})
	if err != nil {
		_ = c.remove()
		return nil, fmt.Errorf("devenv: %w", err)
	}
	return &Postgres{URL: url, Source: "docker", close: c.remove}, nil
}
