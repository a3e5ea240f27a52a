// Package containers runs the Postgres server and the Kafka broker of
// kafkaonce's dev environment in containers, through testcontainers-go:
// Docker Desktop, Colima, Podman, rootless Docker and remote DOCKER_HOSTs
// are found as testcontainers finds them, and Ryuk removes the containers
// of a process that dies without removing them itself.
//
// It is a module of its own, so that only a module that imports it gets a
// Docker client in its go.mod: a module that uses
// github.com/kafkaonce/kafkaonce/devenv alone runs its Postgres from the
// local server binaries and its broker in the process. Opt in with
//
//	env, err := devenv.Start(ctx, devenv.WithContainers(containers.Docker{}))
//
// or, for a test binary,
//
//	func TestMain(m *testing.M) { devenv.Main(m, devenv.WithContainers(containers.Docker{})) }
//
// Postgres then comes from DATABASE_URL, else the local binaries, else a
// container; Kafka from KAFKA_BROKERS, else an Apache Kafka container
// (KRaft), so that tests run against the broker production runs, else the
// in-process broker.
//
// Whether containers can run is asked once per process, and the answer is
// bounded (see [Docker.Check]): a machine without a Docker engine never
// waits on one, and the line devenv logs says why containers were skipped.
// Set KAFKAONCE_DOCKER=off to skip them where an engine runs.
package containers
