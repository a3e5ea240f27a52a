// Package otelhooks traces a kafkaonce consumer and records its metrics
// through the OpenTelemetry API. It is built only on the consumer's hooks,
// so the consumer package does not depend on OpenTelemetry: import this
// package only if you want the spans and metrics. It uses the API alone;
// the application chooses the SDK and the exporters.
//
//	h, err := otelhooks.New("ledger") // the global tracer and meter providers
//	...
//	cfg.Hooks = append(cfg.Hooks, h)
//
// # Trace context
//
// A message carries the W3C trace context of the span that wrote it in its
// traceparent and tracestate headers. outbox.Write stores the context of
// the span in its ctx with the row (an HTTP request's, under otelhttp;
// the handler's, for a row written by a handler traced here), and the
// relay publishes the row's headers as they are. A dead letter keeps its
// message's headers, so a redrive continues the message's trace, and so
// does a consumer of Config.DeadLetterTopic. Any producer that injects
// W3C trace context into Kafka headers joins in the same way.
//
// # Spans
//
//   - "transaction <topic>": one per batch transaction, a new root, with a
//     link to each distinct span its messages were written under (the
//     first 128, the SDK's default limit): a batch has many parents, and
//     a span has one. Its events are what befell
//     single messages: "message skipped" (a duplicate), "message
//     dead-lettered", "fingerprint conflict", and "contention" when the
//     transaction lost a race for rows and runs again.
//   - "process <topic>": one per handler call for one message, a child of
//     the span that wrote the message, linked to its transaction's span;
//     a message without trace context, or with one that does not parse,
//     gets the transaction's span for parent. The handler's ctx carries
//     this span, so the handler's own spans are its children. A
//     BatchHandler called for several messages runs in the transaction's
//     span, which links to them all.
//
// A handler span that fails has status Error and the error recorded; so
// has a transaction that did not commit.
//
// # Metrics
//
// The same as package promhooks, by the semantic conventions' names where
// they have one (messaging.client.consumed.messages,
// messaging.process.duration), kafkaonce.* otherwise; docs/metrics.md maps
// one to the other. NewRelay records an outbox relay's metrics
// (kafkaonce.outbox.*: deliveries, failed attempts, latency, the backlog);
// pass it in outbox.RelayConfig.Hooks.
package otelhooks
