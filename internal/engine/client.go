package engine

import (
	"fmt"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/kafkago"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// newClient makes the Kafka client the configuration selects.
func (c *Consumer) newClient() (kafkaclient.Client, error) {
	cfg, err := c.clientConfig()
	if err != nil {
		return nil, err
	}
	if c.cfg.KafkaClient == kafkaoncetype.KafkaGo {
		return kafkago.New(cfg, c.cfg.Dialer)
	}
	return franz.New(cfg)
}

// clientConfig is the configuration of the consumer's Kafka clients.
func (c *deps) clientConfig() (kafkaclient.Config, error) {
	mech, err := kafkaclient.Mechanism(c.cfg.SASL)
	if err != nil {
		return kafkaclient.Config{}, fmt.Errorf("consumer: %w", err)
	}
	return kafkaclient.Config{
		Brokers:  c.cfg.Brokers,
		TLS:      c.cfg.TLS,
		SASL:     mech,
		ClientID: "kafkaonce-" + c.cfg.Name,
		Group: kafkaclient.GroupConfig{
			ID:                c.cfg.GroupID,
			Topics:            c.cfg.Topics,
			SessionTimeout:    c.cfg.SessionTimeout,
			RebalanceTimeout:  c.cfg.RebalanceTimeout,
			HeartbeatInterval: c.cfg.HeartbeatInterval,
			InstanceID:        c.cfg.InstanceID,
			ConsumerProtocol:  c.cfg.GroupProtocol == kafkaoncetype.ConsumerProtocol,
		},
		FetchMaxBytes:  c.cfg.FetchMaxBytes,
		MaxBatch:       c.cfg.MaxBatch,
		MetadataMaxAge: c.cfg.MetadataMaxAge,
		Logger:         c.log,
		Dials:          c.dials,
	}, nil
}
