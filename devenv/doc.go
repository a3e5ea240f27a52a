// Package devenv gives a program or a test what a kafkaonce consumer runs
// against, a Postgres database and a Kafka broker, with no setup:
//
//   - Postgres: DATABASE_URL when it is set; else a throwaway cluster started
//     from the PostgreSQL server binaries installed on the machine (initdb,
//     pg_ctl; as the "postgres" OS user when the process is root).
//   - Kafka: KAFKA_BROKERS (comma-separated) when it is set; else a broker
//     started in the process (franz-go's kfake), which speaks the Kafka
//     protocol over TCP on loopback, consumer groups included.
//
// With WithContainers, a machine with a container engine also gets an
// Apache Kafka broker in a container in place of the in-process one, and a
// Postgres container when no local binaries are installed. devenv runs no
// container itself: the module github.com/kafkaonce/kafkaonce/devenv/containers
// does, through testcontainers-go, so that only a module that imports it
// gets a Docker client in its go.mod.
//
// What devenv started, it stops: Env.Close for a program, the end of the
// test (or of the test binary, with Main) for a test. What it was given
// through DATABASE_URL or KAFKA_BROKERS it leaves running.
//
// A program:
//
//	env, err := devenv.Start(ctx)
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer env.Close()
//	// env.Pool, env.Brokers, env.CreateTopic, env.Produce
//
// A test gets a fresh kafkaonce schema, and names of its own for topics and
// consumers, so tests can share one database and one broker:
//
//	func TestMain(m *testing.M) { devenv.Main(m) } // one Env per test binary
//
//	func TestCredits(t *testing.T) {
//		env := devenv.ForTest(t)
//		topic := env.Topic(3)
//		cfg := &consumer.Config{Name: env.Name("credits"), Brokers: env.Brokers,
//			Topics: []string{topic}, Schema: env.Schema, Handler: credit}
//		...
//	}
//
// The in-process broker keeps everything in memory and is meant for
// development and tests only; so is the throwaway cluster, which trades
// durability for speed (fsync is off). Whether containers can run is asked
// once per process, within a bound, so a machine without an engine never
// waits on one; set KAFKAONCE_DOCKER=off to skip them where one runs.
package devenv
