package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/pgcluster"
)

// Postgres is a reachable Postgres server.
type Postgres struct {
	// URL connects to a database on the server as a superuser.
	URL string
	// Source says where the server came from: "DATABASE_URL", "local
	// binaries" or SourceContainer.
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

// StartPostgres returns DATABASE_URL's server, or starts one: from the
// local server binaries, else in a container of rt (nil: none). The error
// of a machine with none of the options says what to install or set.
func StartPostgres(ctx context.Context, rt Containers) (*Postgres, error) {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		return &Postgres{URL: url, Source: "DATABASE_URL"}, nil
	}
	p, err := postgresLocal(ctx)
	if err == nil {
		return p, nil
	}
	if rt == nil {
		return nil, fmt.Errorf("devenv: no Postgres: set DATABASE_URL to a server you can create schemas on, or install PostgreSQL server binaries (initdb, pg_ctl): %w", err)
	}
	p, cerr := postgresContainer(ctx, rt, 0)
	if cerr != nil {
		return nil, fmt.Errorf("devenv: no Postgres: set DATABASE_URL to a server you can create schemas on, install PostgreSQL server binaries (initdb, pg_ctl), or start a container engine: %w", errors.Join(err, cerr))
	}
	return p, nil
}

// StartPostgresOn starts a server of its own listening on 127.0.0.1:port,
// whatever DATABASE_URL says: in a container of rt when container is set,
// else from the local binaries, else in a container of rt (nil: none). It
// is for servers that outlive the processes using them (kafkaonce dev).
func StartPostgresOn(ctx context.Context, port int, rt Containers, container bool) (*Postgres, error) {
	if container {
		if rt == nil {
			return nil, fmt.Errorf("devenv: no Postgres container on port %d: no container runtime", port)
		}
		return postgresContainer(ctx, rt, port)
	}
	p, err := postgresLocalOn(ctx, port)
	if err == nil {
		return p, nil
	}
	if rt == nil {
		return nil, fmt.Errorf("devenv: no Postgres on port %d: install PostgreSQL server binaries (initdb, pg_ctl): %w", port, err)
	}
	p, cerr := postgresContainer(ctx, rt, port)
	if cerr != nil {
		return nil, fmt.Errorf("devenv: no Postgres on port %d: install PostgreSQL server binaries (initdb, pg_ctl), or start a container engine: %w", port, errors.Join(err, cerr))
	}
	return p, nil
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

// postgresContainer runs Postgres in a container of rt, once rt's check
// passes.
func postgresContainer(ctx context.Context, rt Containers, port int) (*Postgres, error) {
	if err := rt.Check(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	url, remove, err := rt.StartPostgres(ctx, port)
	if err != nil {
		return nil, err
	}
	return &Postgres{URL: url, Source: SourceContainer, close: remove}, nil
}
