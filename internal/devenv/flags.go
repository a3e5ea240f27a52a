package devenv

import (
	"flag"
	"os"
)

// KeepEnv, set to 1, keeps what a program made in the database when it
// ends (see devenv.Env.Own); RegisterFlags's -keep sets it.
const KeepEnv = "KAFKAONCE_KEEP"

// RegisterFlags adds -database-url, -brokers and -keep to fs. They default
// to the environment (DATABASE_URL, KAFKA_BROKERS, KAFKAONCE_KEEP); Apply
// copies what was given back into the environment, where StartPostgres,
// StartKafka and Env.Close look.
func RegisterFlags(fs *flag.FlagSet) (apply func()) {
	db := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres to use (default $DATABASE_URL; else a throwaway local cluster)")
	brokers := fs.String("brokers", os.Getenv("KAFKA_BROKERS"), "Kafka brokers to use, comma-separated (default $KAFKA_BROKERS; else an in-process broker)")
	keep := fs.Bool("keep", os.Getenv(KeepEnv) == "1", "keep the schemas the program made when it ends (default: dropped; $"+KeepEnv+"=1)")
	return func() {
		if *keep {
			os.Setenv(KeepEnv, "1")
		}
		if *db != "" {
			os.Setenv("DATABASE_URL", *db)
		}
		if *brokers != "" {
			os.Setenv("KAFKA_BROKERS", *brokers)
		}
	}
}
