package devenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka is a reachable Kafka-protocol broker.
type Kafka struct {
	// Brokers are the bootstrap addresses.
	Brokers []string
	// Source says where the broker came from: "KAFKA_BROKERS",
	// SourceContainer or "in-process".
	Source string
	// Fake is the in-process cluster when Source is "in-process", so tests
	// can intercept requests.
	Fake  *kfake.Cluster
	close func() error
}

// Close stops the broker if this package started it.
func (k *Kafka) Close() error {
	if k.close == nil {
		return nil
	}
	return k.close()
}

// StartKafka returns KAFKA_BROKERS's brokers, or starts one: in a
// container of rt when rt is not nil and its check passes, else the
// in-process broker.
func StartKafka(ctx context.Context, rt Containers) (*Kafka, error) {
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		return &Kafka{Brokers: SplitBrokers(env), Source: "KAFKA_BROKERS"}, nil
	}
	if rt != nil && rt.Check(ctx) == nil {
		return kafkaContainer(ctx, rt, 0)
	}
	return StartFakeKafka()
}

// StartFakeKafka starts an in-process Kafka-protocol broker on a loopback
// port. It speaks the wire protocol over TCP, so both clients talk to it
// exactly as they would to a real broker, consumer groups and transactions
// included.
func StartFakeKafka(opts ...kfake.Opt) (*Kafka, error) {
	base := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.ListenFn(loopbackListen),
	}
	c, err := kfake.NewCluster(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("devenv: start in-process Kafka: %w", err)
	}
	return &Kafka{Brokers: c.ListenAddrs(), Source: "in-process", Fake: c, close: func() error { c.Close(); return nil }}, nil
}

// StartKafkaOn starts a broker of its own listening on 127.0.0.1:port,
// whatever KAFKA_BROKERS says: in a container of rt when container is set
// (it fails when rt's check does), else the in-process broker. It is for
// brokers that outlive the processes using them (kafkaonce dev).
func StartKafkaOn(ctx context.Context, port int, rt Containers, container bool) (*Kafka, error) {
	if container {
		if rt == nil {
			return nil, fmt.Errorf("devenv: no Kafka container on port %d: no container runtime", port)
		}
		if err := rt.Check(ctx); err != nil {
			return nil, fmt.Errorf("devenv: no Kafka container on port %d: %w", port, err)
		}
		return kafkaContainer(ctx, rt, port)
	}
	k, err := StartFakeKafka(kfake.Ports(port))
	if err != nil {
		return nil, fmt.Errorf("devenv: in-process Kafka on port %d: %w", port, err)
	}
	return k, nil
}

func kafkaContainer(ctx context.Context, rt Containers, port int) (*Kafka, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	brokers, remove, err := rt.StartKafka(ctx, port)
	if err != nil {
		return nil, err
	}
	return &Kafka{Brokers: brokers, Source: SourceContainer, close: remove}, nil
}

// SplitBrokers parses a comma-separated broker list, ignoring blanks.
func SplitBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}
