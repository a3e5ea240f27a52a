// Command kafkaonce operates kafkaonce consumers: it applies the schema,
// shows where each partition stands, audits a range of the log against what
// was applied, rewinds consumer groups for a replay, moves or forgets stored
// positions, lists and redrives dead letters, and prunes old claims.
//
//	go run ./cmd/kafkaonce --help
//
// Settings come from flags or the environment: DATABASE_URL, KAFKA_BROKERS,
// and KAFKA_PASSWORD for SASL. Passwords are never printed.
//
// Exit codes: 0 success; 1 the command ran and found a problem (an audit
// finding, a failed redrive, a status that could not read Kafka); 2 the
// command could not run (bad flags, no database, no broker).
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:], newStreams()))
}
