package containers

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// StartPostgres runs a Postgres server in a container, its port published
// on 127.0.0.1:port, or on a free port of the engine's host when port is
// 0, and returns a superuser's URL (trust
// authentication, sslmode=disable) and a function that removes the
// container. The server runs with fsync off, as the throwaway local
// cluster does: fast, and not durable across a crash of the engine.
func (d Docker) StartPostgres(ctx context.Context, port int) (url string, remove func() error, err error) {
	c, err := postgres.Run(ctx, d.postgresImage(),
		postgres.WithDatabase("postgres"),
		postgres.WithUsername("postgres"),
		postgres.BasicWaitStrategies(),
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}),
		testcontainers.WithCmdArgs("-c", "fsync=off", "-c", "max_connections=300"),
		testcontainers.WithLogger(d.logger()),
		publishOn("5432/tcp", port),
		labels,
	)
	remove = terminator(c)
	if err != nil {
		return "", nil, fmt.Errorf("containers: Postgres (%s): %w", d.postgresImage(), joinRemove(err, remove))
	}
	addr, err := c.PortEndpoint(ctx, "5432/tcp", "")
	if err == nil {
		url = "postgres://postgres@" + addr + "/postgres?sslmode=disable"
	}
	if err == nil {
		err = ping(ctx, url)
	}
	if err != nil {
		return "", nil, fmt.Errorf("containers: Postgres (%s): %w", d.postgresImage(), joinRemove(err, remove))
	}
	return url, remove, nil
}

func ping(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}
