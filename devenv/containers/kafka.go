package containers

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// StartKafka runs an Apache Kafka broker (KRaft, one node acting as broker
// and controller) in a container and returns its bootstrap address and a
// function that removes the container.
//
// A Kafka client dials the address the broker advertises, so the host port
// is chosen before the container starts and published one to one on
// loopback: port, or a free port when port is 0. The broker is therefore
// reachable only with an engine on this machine (Docker Desktop, Colima
// and Podman forward loopback ports); with a remote DOCKER_HOST, run the
// broker there and set KAFKA_BROKERS. testcontainers' kafka module
// does not fit: it drives the scripts of Confluent's images, not
// apache/kafka's.
func (d Docker) StartKafka(ctx context.Context, port int) (brokers []string, remove func() error, err error) {
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, nil, fmt.Errorf("containers: Kafka: %w", err)
		}
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c, err := testcontainers.Run(ctx, d.kafkaImage(),
		testcontainers.WithExposedPorts("9092/tcp"),
		publishOn("9092/tcp", port),
		testcontainers.WithEnv(map[string]string{
			"KAFKA_NODE_ID":                                  "1",
			"KAFKA_PROCESS_ROLES":                            "broker,controller",
			"KAFKA_LISTENERS":                                "PLAINTEXT://:9092,CONTROLLER://:9093",
			"KAFKA_ADVERTISED_LISTENERS":                     "PLAINTEXT://" + addr,
			"KAFKA_CONTROLLER_LISTENER_NAMES":                "CONTROLLER",
			"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":           "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
			"KAFKA_CONTROLLER_QUORUM_VOTERS":                 "1@localhost:9093",
			"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
			"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
			"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
			"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
		}),
		testcontainers.WithWaitStrategyAndDeadline(2*time.Minute,
			wait.ForLog("Kafka Server started"),
			wait.ForListeningPort("9092/tcp"),
		),
		testcontainers.WithLogger(d.logger()),
		labels,
	)
	remove = terminator(c)
	if err == nil {
		err = answersMetadata(ctx, addr)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("containers: Kafka (%s) at %s: %w", d.kafkaImage(), addr, joinRemove(err, remove))
	}
	return []string{addr}, remove, nil
}

// answersMetadata waits, up to a minute, until the broker at addr answers
// a metadata request: the log line says the server started, not that its
// listener already serves clients through the engine's port forwarding.
func answersMetadata(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		err := func() error {
			conn, err := kafka.DialContext(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Brokers()
			return err
		}()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no metadata from the broker: %w", err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// freePort is a loopback port no listener holds now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
