// Package kafkaoncetype holds the small types that kafkaonce's packages
// share, so that each is declared once: the public packages, the engine and
// the Kafka clients behind it all use these. It imports nothing of
// kafkaonce's, and users rarely need to name it: consumer and the other
// packages re-export what they hand out.
package kafkaoncetype

// Header is a Kafka record header. Kafka allows a key to repeat, and keeps
// headers in the order the producer wrote them.
type Header struct {
	Key   string
	Value []byte
}
