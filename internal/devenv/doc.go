// Package devenv finds or starts the Postgres server and Kafka broker that
// tests and example programs run against, so that both work on a fresh
// machine with no setup:
//
//   - Postgres: DATABASE_URL when set; else a container when Docker answers;
//     else a throwaway cluster from the local PostgreSQL binaries.
//   - Kafka: KAFKA_BROKERS when set; else a container when Docker answers;
//     else an in-process Kafka-protocol broker (kfake) listening on loopback.
//
// Docker is only asked when its socket exists and answers a health check
// within a few seconds, so machines without Docker never wait on it. Set
// KAFKAONCE_DOCKER=off to skip Docker even where it runs.
package devenv
