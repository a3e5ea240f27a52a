package pgarray_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kafkaonce/kafkaonce/internal/pgarray"
)

// The point of Array: encoding allocates per array, not per element.
func TestEncodeAllocatesPerArrayNotPerElement(t *testing.T) {
	m := pgtype.NewMap()
	const n = 1000
	texts, bytes, ints := make(pgarray.Array[pgarray.Text], n), make(pgarray.Array[pgarray.Bytes], n), make(pgarray.Array[pgarray.Int8], n)
	for i := range n {
		texts[i] = pgarray.Text("0190f3c2-7b1e-7c3a-8f00-0000000000aa")
		bytes[i] = make([]byte, 32)
		ints[i] = pgarray.Int8(1 << 40)
	}
	buf := make([]byte, 0, 128<<10)
	for _, c := range []struct {
		name string
		oid  uint32
		v    any
	}{{"text[]", pgtype.TextArrayOID, texts}, {"bytea[]", pgtype.ByteaArrayOID, bytes}, {"bigint[]", pgtype.Int8ArrayOID, ints}} {
		allocs := testing.AllocsPerRun(20, func() {
			if _, err := m.Encode(c.oid, pgtype.BinaryFormatCode, c.v, buf[:0]); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 10 {
			t.Errorf("%s: %.0f allocations for %d elements; want a handful", c.name, allocs, n)
		}
	}
}

// The arrays arrive in Postgres as what they hold.
func TestRoundTrip(t *testing.T) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		t.Skip("DATABASE_URL not set")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var got string
	err = conn.QueryRow(ctx, `SELECT string_agg(t || ':' || encode(b, 'hex') || ':' || i, ',' ORDER BY i) FROM unnest($1::text[], $2::bytea[], $3::bigint[]) AS u(t, b, i)`,
		pgarray.Array[pgarray.Text]{"a", "é,\"x\""}, pgarray.Array[pgarray.Bytes]{{0x01, 0xff}, {}}, pgarray.Array[pgarray.Int8]{-1, 1 << 40}).Scan(&got)
	if err != nil {
		t.Fatal(err)
	}
	if want := `a:01ff:-1,é,"x"::1099511627776`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
