package schema

// ConsumerTables are the tables whose rows name the consumer they belong to
// in a text column called consumer. With processed_messages (which names
// it by number, consumer_id) and consumers (by name) they are all a
// consumer leaves in a schema, so a tool that removes a consumer's traces
// (consumertest's cleanup) deletes from these and nothing else: a table of
// the application's in the same schema may well have a consumer column
// too. TestConsumerTablesAreAllThatNameAConsumer keeps the list whole.
var ConsumerTables = []string{"consumer_offsets", "dead_letters", "message_attempts", "open_batches", "partition_runs", "pauses", "suspect_duplicates"}
