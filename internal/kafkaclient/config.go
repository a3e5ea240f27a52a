package kafkaclient

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/aws"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kafkaonce/kafkaonce/kafkaconn"
)

// Config is what a Client is made from.
type Config struct {
	Brokers []string
	TLS     *tls.Config
	// SASL authenticates connections (nil: none); see Mechanism.
	SASL     sasl.Mechanism
	ClientID string
	// Group is the consumer group RunGroup joins (unused by clients that
	// only read bounds or fetch).
	Group GroupConfig
	// FetchMaxBytes bounds one fetch response; MaxBatch bounds how many
	// records a partition holds fetched ahead of its worker.
	FetchMaxBytes int
	MaxBatch      int
	// MetadataMaxAge bounds how old the client's view of the cluster may
	// get: partitions added to a topic are seen, and assigned, within it.
	MetadataMaxAge time.Duration
	Logger         *slog.Logger
	// Dials is told of every connection the client opens to a broker,
	// and how it went (nil: the client makes its own; see Dials).
	Dials *Dials
}

// GroupConfig says which group RunGroup joins, and how.
type GroupConfig struct {
	ID                string
	Topics            []string
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	HeartbeatInterval time.Duration
	// InstanceID makes the member static (group.instance.id): one that
	// comes back within SessionTimeout gets its partitions back without a
	// rebalance.
	InstanceID string
	// ConsumerProtocol joins with the consumer group protocol (KIP-848),
	// the broker assigning partitions; a client that cannot, or a broker
	// that does not give it, fails RunGroup rather than fall back.
	ConsumerProtocol bool
}

// Mechanism returns franz-go's mechanism for s (nil for a nil s). Both
// clients authenticate with it: the kafka-go one through an adapter.
func Mechanism(s *kafkaconn.SASL) (sasl.Mechanism, error) {
	if s == nil {
		return nil, nil
	}
	if err := s.Check(); err != nil {
		return nil, err
	}
	switch s.Mechanism {
	case kafkaconn.Plain:
		return plain.Auth{User: s.Username, Pass: s.Password}.AsMechanism(), nil
	case kafkaconn.ScramSHA256:
		return scram.Auth{User: s.Username, Pass: s.Password}.AsSha256Mechanism(), nil
	case kafkaconn.ScramSHA512:
		return scram.Auth{User: s.Username, Pass: s.Password}.AsSha512Mechanism(), nil
	case kafkaconn.OAuthBearer:
		token := s.Token
		return oauth.Oauth(func(ctx context.Context) (oauth.Auth, error) {
			t, err := token(ctx)
			if err != nil {
				return oauth.Auth{}, fmt.Errorf("kafkaconn: OAUTHBEARER token: %w", err)
			}
			return oauth.Auth{Token: t}, nil
		}), nil
	case kafkaconn.AWSMSKIAM:
		creds := s.AWS
		return aws.ManagedStreamingIAM(func(ctx context.Context) (aws.Auth, error) {
			c, err := creds(ctx)
			if err != nil {
				return aws.Auth{}, fmt.Errorf("kafkaconn: AWS_MSK_IAM credentials: %w", err)
			}
			return aws.Auth{AccessKey: c.AccessKey, SecretKey: c.SecretKey, SessionToken: c.SessionToken, UserAgent: "kafkaonce"}, nil
		}), nil
	}
	return nil, fmt.Errorf("kafkaconn: unknown SASL mechanism %q", s.Mechanism)
}
