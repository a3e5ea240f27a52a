package devenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka is a reachable Kafka-protocol broker.
type Kafka struct {
	// Brokers are the bootstrap addresses.
	Brokers []string
	// Source says where the broker came from: "KAFKA_BROKERS", "docker" or
	// "in-process".
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

// StartKafka returns KAFKA_BROKERS's brokers, or starts one: a container when
// useDocker is true and Docker answers, else the in-process broker.
func StartKafka(ctx context.Context, useDocker bool) (*Kafka, error) {
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		return &Kafka{Brokers: SplitBrokers(env), Source: "KAFKA_BROKERS"}, nil
	}
	if useDocker && DockerAvailable() {
		return kafkaDocker(ctx)
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
// whatever KAFKA_BROKERS says: Apache Kafka in a container when container
// is set (it fails without Docker), else the in-process broker. It is for
// brokers that outlive the processes using them (kafkaonce dev).
func StartKafkaOn(ctx context.Context, port int, container bool) (*Kafka, error) {
	if container {
		if !DockerAvailable() {
			return nil, fmt.Errorf("devenv: no Kafka container on port %d: %w", port, errNoDocker)
		}
		return kafkaDockerOn(ctx, port)
	}
	k, err := StartFakeKafka(kfake.Ports(port))
	if err != nil {
		return nil, fmt.Errorf("devenv: in-process Kafka on port %d: %w", port, err)
	}
	return k, nil
}

func kafkaDocker(ctx context.Context) (*Kafka, error) { return kafkaDockerOn(ctx, 0) }

// kafkaDockerOn runs Apache Kafka with its listener published on loopback
// at port (0: a free one).
func kafkaDockerOn(ctx context.Context, port int) (*Kafka, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	// The advertised listener must name the address clients dial, so the host
	// port is chosen before the container starts and published one to one.
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	flags := []string{"--publish", fmt.Sprintf("127.0.0.1:%d:9092", port)}
	for _, kv := range [][2]string{
		{"KAFKA_NODE_ID", "1"},
		{"KAFKA_PROCESS_ROLES", "broker,controller"},
		{"KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093"},
		{"KAFKA_ADVERTISED_LISTENERS", fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", port)},
		{"KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER"},
		{"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"},
		{"KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093"},
		{"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1"},
		{"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1"},
		{"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1"},
		{"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"},
	} {
		flags = append(flags, "--env", kv[0]+"="+kv[1])
	}
	// apache/kafka 3.9 runs KRaft by default and accepts the JoinGroup v1
	// that kafka-go's consumer group sends (4.0.0 does not).
	c, err := runContainer(ctx, flags, "apache/kafka:3.9.1")
	if err != nil {
		return nil, fmt.Errorf("devenv: start Kafka container: %w", err)
	}
	brokers := []string{fmt.Sprintf("127.0.0.1:%d", port)}
	err = waitReady(ctx, 2*time.Minute, "Kafka container", func(ctx context.Context) error {
		conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Brokers()
		return err
	})
	if err != nil {
		_ = c.remove()
		return nil, fmt.Errorf("devenv: %w", err)
	}
	return &Kafka{Brokers: brokers, Source: "docker", close: c.remove}, nil
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
