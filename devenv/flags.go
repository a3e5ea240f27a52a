package devenv

import (
	"flag"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

// RegisterFlags adds -database-url and -brokers to fs, defaulting to
// DATABASE_URL and KAFKA_BROKERS. Call the returned apply after fs is
// parsed and before Start: it puts the values given back into the
// environment, where Start looks.
func RegisterFlags(fs *flag.FlagSet) (apply func()) { return devenv.RegisterFlags(fs) }
