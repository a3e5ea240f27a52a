package kafkago

import (
	"context"
	"fmt"
	"sync"

	kgosasl "github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
)

// topicIDs reads topics' ids (and partition counts). kafka-go's protocol package speaks Metadata
// up to version 8, and ids came with version 10: they are read with
// franz-go's client instead, over the same brokers, TLS and SASL as every
// other connection of the client (a kafka-go SASL mechanism brought with
// a Dialer is adapted).
type topicIDs struct {
	once sync.Once
	cl   *kgo.Client
	err  error
}

func (c *Client) topicID(ctx context.Context, topic string) (kafkaclient.TopicID, error) {
	id, _, err := c.topicMetadata(ctx, topic)
	return id, err
}

// topicMetadata reads a topic's id and how many partitions it has.
func (c *Client) topicMetadata(ctx context.Context, topic string) (kafkaclient.TopicID, int, error) {
	c.ids.once.Do(func() {
		// The dialer's DialFunc does its TLS (see Connection), and tells
		// Dials how each connection went.
		opts := []kgo.Opt{kgo.SeedBrokers(c.cfg.Brokers...), kgo.Dialer(c.dialer.DialFunc)}
		if c.dialer.ClientID != "" {
			opts = append(opts, kgo.ClientID(c.dialer.ClientID))
		}
		switch m := c.dialer.SASLMechanism.(type) {
		case nil:
		case mechanism:
			opts = append(opts, kgo.SASL(m.m))
		default:
			opts = append(opts, kgo.SASL(franzMechanism{m}))
		}
		c.ids.cl, c.ids.err = kgo.NewClient(opts...)
	})
	if c.ids.err != nil {
		return kafkaclient.TopicID{}, 0, fmt.Errorf("kafkago: metadata of %s: %w", topic, c.ids.err)
	}
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	id, n, err := franz.TopicMetadata(ctx, c.ids.cl, topic)
	if err != nil {
		return kafkaclient.TopicID{}, 0, fmt.Errorf("kafkago: %w", err)
	}
	return id, n, nil
}

func (c *Client) closeTopicIDs() {
	if c.ids.cl != nil {
		c.ids.cl.Close()
	}
}

// franzMechanism lets franz-go authenticate with a kafka-go SASL
// mechanism: the other way round from mechanism.
type franzMechanism struct{ m kgosasl.Mechanism }

func (m franzMechanism) Name() string { return m.m.Name() }

func (m franzMechanism) Authenticate(ctx context.Context, _ string) (sasl.Session, []byte, error) {
	sm, first, err := m.m.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	return franzSession{ctx: ctx, sm: sm}, first, nil
}

type franzSession struct {
	ctx context.Context
	sm  kgosasl.StateMachine
}

func (s franzSession) Challenge(challenge []byte) (bool, []byte, error) {
	return s.sm.Next(s.ctx, challenge)
}
