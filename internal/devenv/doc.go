// Package devenv finds or starts the Postgres server and Kafka broker that
// tests, example programs and kafkaonce dev run against, so that all of
// them work on a fresh machine with no setup:
//
//   - Postgres: DATABASE_URL when set; else a throwaway cluster from the
//     local PostgreSQL binaries; else a container, when the caller passes
//     a Containers whose check passes.
//   - Kafka: KAFKA_BROKERS when set; else a container, when the caller
//     passes a Containers whose check passes; else an in-process
//     Kafka-protocol broker (kfake) listening on loopback.
//
// The package runs no container itself: the module
// github.com/kafkaonce/kafkaonce/devenv/containers does, through
// testcontainers-go, so that only what imports it needs a Docker client.
package devenv
