package devenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// CreateTopic creates a topic through the cluster's controller and waits
// until all of its partitions have leaders.
func CreateTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	conn, cc, err := dialController(ctx, brokers)
	if err != nil {
		return err
	}
	defer conn.Close()
	defer cc.Close()
	if err := cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}); err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		parts, err := conn.ReadPartitions(topic)
		ready := err == nil && len(parts) == partitions
		for _, p := range parts {
			ready = ready && p.Leader.Host != ""
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s: partitions have no leader after 30s (last error: %v)", topic, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DeleteTopic deletes a topic through the cluster's controller (a topic
// that does not exist is not an error).
func DeleteTopic(ctx context.Context, brokers []string, topic string) error {
	conn, cc, err := dialController(ctx, brokers)
	if err != nil {
		return err
	}
	defer conn.Close()
	defer cc.Close()
	if err := cc.DeleteTopics(topic); err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
		return fmt.Errorf("delete topic %s: %w", topic, err)
	}
	return nil
}

// dialController connects to the first broker and to the controller.
func dialController(ctx context.Context, brokers []string) (conn, controller *kafka.Conn, err error) {
	conn, err = kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return nil, nil, fmt.Errorf("dial %s: %w", brokers[0], err)
	}
	c, err := conn.Controller()
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("find controller: %w", err)
	}
	controller, err = kafka.DialContext(ctx, "tcp", net.JoinHostPort(c.Host, strconv.Itoa(c.Port)))
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("dial controller: %w", err)
	}
	return conn, controller, nil
}
