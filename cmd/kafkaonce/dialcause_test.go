package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// status spoken in TLS to a plaintext broker names the cause, not "the
// brokers did not answer in time".
func TestStatusNamesWhyItCannotConnect(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(1, "m")
	w.runUntil(func(*consumer.Config) {}, "the message processed", func() bool {
		return w.db.Int(t, `SELECT coalesce(max(next_offset), 0) FROM `+w.db.Table("consumer_offsets")) >= 1
	})()
	out, errOut, code := w.cli("status", "--consumer", w.name, "--kafka-tls")
	require.Equal(t, 1, code, out+errOut)
	require.Contains(t, out, "cannot connect to the brokers: TLS handshake failed: is the broker's listener TLS?")
	require.Contains(t, out, "("+w.kafka.Brokers[0]+", failing since ")
	require.NotContains(t, out, "did not answer in time")
}
