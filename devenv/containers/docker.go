package containers

import (
	"net/netip"
	"strconv"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"

	"github.com/kafkaonce/kafkaonce/devenv"
)

// The images Docker runs when its fields are empty.
const (
	DefaultPostgresImage = "postgres:15-alpine"
	// DefaultKafkaImage is Apache Kafka 3.9, which runs KRaft by default
	// and still accepts the JoinGroup v1 that kafka-go's consumer group
	// sends (4.x refuses it; set KafkaImage to apache/kafka:4.1.1 for a
	// franz-go consumer).
	DefaultKafkaImage = "apache/kafka:3.9.1"
)

// Docker runs containers through testcontainers-go. It implements
// devenv.ContainerRuntime; the zero value runs the default images and
// keeps testcontainers quiet.
type Docker struct {
	// PostgresImage is the image of the Postgres server (default
	// DefaultPostgresImage): the official image, or one that accepts its
	// environment.
	PostgresImage string
	// KafkaImage is the image of the Kafka broker (default
	// DefaultKafkaImage): an apache/kafka image of 3.7 or later, which
	// runs KRaft configured by KAFKA_* variables.
	KafkaImage string
	// Logf, when set, receives testcontainers' own lines (pulling,
	// creating, waiting).
	Logf func(format string, args ...any)
}

func (d Docker) postgresImage() string { return orDefault(d.PostgresImage, DefaultPostgresImage) }
func (d Docker) kafkaImage() string    { return orDefault(d.KafkaImage, DefaultKafkaImage) }

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// logger is what testcontainers logs through.
func (d Docker) logger() tclog.Logger {
	if d.Logf == nil {
		return tclog.NewNoopLogger()
	}
	return logfLogger(d.Logf)
}

type logfLogger func(format string, args ...any)

func (l logfLogger) Printf(format string, args ...any) { l(format, args...) }

// publishOn binds the container's port to 127.0.0.1:hostPort, so that a
// dev server without a password is not reachable from the network. With
// hostPort 0 it leaves the binding to testcontainers (a free port on every
// interface of the engine's host), which also works with a remote engine.
func publishOn(containerPort string, hostPort int) testcontainers.CustomizeRequestOption {
	return testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
		if hostPort == 0 {
			return
		}
		hc.PortBindings = network.PortMap{
			network.MustParsePort(containerPort): {{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(hostPort)}},
		}
	})
}

// labels mark what kafkaonce started, for an operator who looks for it.
var labels = testcontainers.WithLabels(map[string]string{"kafkaonce.devenv": "1"})

var _ devenv.ContainerRuntime = Docker{}
