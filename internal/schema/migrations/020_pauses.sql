-- 020: pauses, put on a consumer, one of its topics or one partition.
--
-- A paused partition stays assigned to its member, fetches nothing and
-- holds no transaction open, until the pause is lifted. The pause is a row
-- here, not a flag in one process, so that it holds across rebalances and
-- restarts and whichever member owns the partition obeys it: kafkaonce
-- pause writes it from anywhere, and every running consumer reads its
-- pauses each second. topic '' pauses every topic of the consumer and
-- partition -1 every partition of the topic.
CREATE TABLE {{schema}}.pauses (
    consumer  text        NOT NULL,
    topic     text        NOT NULL DEFAULT '',
    partition integer     NOT NULL DEFAULT -1,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text        NOT NULL DEFAULT '',
    reason    text        NOT NULL DEFAULT '',
    PRIMARY KEY (consumer, topic, partition),
    CHECK (partition >= -1),
    CHECK (topic <> '' OR partition = -1)
);
