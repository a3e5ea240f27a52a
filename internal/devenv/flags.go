package devenv

import (
	"flag"
	"os"
)

// RegisterFlags adds -database-url and -brokers to fs. They default to the
// environment (DATABASE_URL, KAFKA_BROKERS); Apply copies what was given back
// into the environment, where StartPostgres and StartKafka look.
func RegisterFlags(fs *flag.FlagSet) (apply func()) {
	db := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres to use (default $DATABASE_URL; else a throwaway local cluster)")
	brokers := fs.String("brokers", os.Getenv("KAFKA_BROKERS"), "Kafka brokers to use, comma-separated (default $KAFKA_BROKERS; else an in-process broker)")
	return func() {
		if *db != "" {
			os.Setenv("DATABASE_URL", *db)
		}
		if *brokers != "" {
			os.Setenv("KAFKA_BROKERS", *brokers)
		}
	}
}
