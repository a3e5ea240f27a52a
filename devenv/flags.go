package devenv

import (
	"flag"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

// RegisterFlags adds -database-url, -brokers and -keep to fs, defaulting
// to DATABASE_URL, KAFKA_BROKERS and KAFKAONCE_KEEP. Call the returned
// apply after fs is parsed and before Start: it puts the values given back
// into the environment, where Start and Close look (-keep keeps the
// schemas Env.Own names).
func RegisterFlags(fs *flag.FlagSet) (apply func()) { return devenv.RegisterFlags(fs) }
