package outbox

import (
	"fmt"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/kafkago"
)

// newClient makes the Kafka client the configuration selects, as a
// consumer does: the relay publishes through the same seam as a
// consumer's dead letters, with the same record sizes and the same answer
// to a record too large.
func (r *Relay) newClient() (kafkaclient.Client, error) {
	mech, err := kafkaclient.Mechanism(r.cfg.SASL)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	cfg := kafkaclient.Config{Brokers: r.cfg.Brokers, TLS: r.cfg.TLS, SASL: mech, ClientID: "kafkaonce-relay", Logger: r.log}
	var c kafkaclient.Client
	if r.cfg.KafkaClient == KafkaGo {
		c, err = kafkago.New(cfg, r.cfg.Dialer)
	} else {
		c, err = franz.New(cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return c, nil
}
