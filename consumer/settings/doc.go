// Package settings declares a consumer's Config, and the interfaces of the
// user code it holds (Handler, BatchHandler, MessageIDSource, Hook), once.
// Package consumer re-exports each under the same name (consumer.Config is
// a settings.Config), and the consumer's engine holds the Config it is
// given whole, its defaults set and validated: a setting is declared here
// once, and reaches the engine without being copied field by field.
//
// Users do not name this package: they write consumer.Config. Names in
// these docs without a package (Consumer, DefaultMaxBatch, HookContention,
// IDFromHeader, ...) are package consumer's. It imports nothing of
// kafkaonce's but kafkaconn and kafkaoncetype, so the engine can import it.
package settings
