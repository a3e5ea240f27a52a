package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/kafkaonce/kafkaonce/internal/pgtext"
)

// rows are messages as the outbox's INSERT takes them: checked, their ids
// made and their headers encoded. Every path that adds rows goes through
// prepare, so a message refused on one is refused on all, in the same
// words.
type rows struct {
	ids, dests, headers []string
	keys, values        [][]byte
	buckets             []int32
}

// insert is the statement that writes rows, with rows.args.
func (o *Outbox) insert() string {
	return `INSERT INTO ` + o.table + ` (id, destination, message_key, key_bucket, message_value, headers)
SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int[], $5::bytea[], $6::jsonb[])`
}

func (r *rows) args() []any {
	return []any{r.ids, r.dests, r.keys, r.buckets, r.values, r.headers}
}

// prepare checks msgs and turns them into rows. It refuses, before
// anything is sent, what Postgres would refuse in the middle of the
// caller's transaction (text it cannot store, an id written twice), which
// fails the whole transaction with an error that names no message, and
// what encoding would change silently (a header name that is not UTF-8,
// which JSON would rewrite). When ctx carries a span, each row carries its
// trace context (see HeaderTraceParent).
func prepare(ctx context.Context, msgs []Message) (*rows, error) {
	n := len(msgs)
	r := &rows{ids: make([]string, n), dests: make([]string, n), headers: make([]string, n),
		keys: make([][]byte, n), values: make([][]byte, n), buckets: make([]int32, n)}
	seen := make(map[string]int, n)
	for i, m := range msgs {
		if err := check(&m); err != nil {
			if n > 1 {
				return nil, fmt.Errorf("outbox: message %d of %d: %w", i+1, n, err)
			}
			return nil, fmt.Errorf("outbox: %w", err)
		}
		id := m.ID
		if id == "" {
			u, err := uuid.NewV7()
			if err != nil {
				return nil, fmt.Errorf("outbox: new id: %w", err)
			}
			id = u.String()
		}
		if j, ok := seen[id]; ok {
			return nil, fmt.Errorf("outbox: messages %d and %d both have ID %q, and the outbox holds one row per id: give each message an id of its own (derive it from what caused it, e.g. \"email:\" + the event's id), or leave ID empty for a new one", j+1, i+1, id)
		}
		seen[id] = i
		h := withTraceContext(ctx, m.Headers)
		if h == nil {
			h = []Header{}
		}
		raw, err := json.Marshal(h)
		if err != nil {
			return nil, fmt.Errorf("outbox: encode headers: %w", err)
		}
		r.ids[i], r.dests[i], r.buckets[i], r.headers[i] = id, m.Destination, bucketOf(m.Key), string(raw)
		r.keys[i], r.values[i] = m.Key, m.Value
	}
	return r, nil
}

// MaxIDBytes is the longest Message.ID the outbox takes. Ids are unique
// through a btree index, whose entries hold at most a third of a page
// (about 2.7 kB, after compression, which an id made of a hash does not
// get); a bound well below that is one the caller can rely on.
const MaxIDBytes = 1000

// check names the first field of m the outbox cannot store as it is.
func check(m *Message) error {
	switch {
	case m.Destination == "":
		return errors.New("Message.Destination must name a topic or a delivery function")
	case !pgtext.Storable(m.Destination):
		return fmt.Errorf("Message.Destination %q is not valid UTF-8 or holds a NUL byte, which Postgres text cannot store: name the topic or delivery function in UTF-8", m.Destination)
	case !pgtext.Storable(m.ID):
		return fmt.Errorf("Message.ID %q is not valid UTF-8 or holds a NUL byte, which Postgres text cannot store: build the id from text (hex- or base64-encode bytes)", m.ID)
	case len(m.ID) > MaxIDBytes:
		return fmt.Errorf("Message.ID is %d bytes, more than the %d the outbox's unique index of ids holds: derive a shorter id (a hash of what caused the message, hex-encoded)", len(m.ID), MaxIDBytes)
	}
	for _, h := range m.Headers {
		if !pgtext.Storable(h.Key) {
			return fmt.Errorf("Message.Headers: header name %q is not valid UTF-8 or holds a NUL byte, which the headers' JSON cannot keep as it is: name headers in UTF-8 (values may be any bytes)", h.Key)
		}
	}
	return nil
}
