// Package pgarray passes Go slices to Postgres array parameters without an
// allocation per element.
//
// pgx encodes a []string (or [][]byte, []int64) parameter through
// pgtype.FlatArray, whose Index returns each element as an interface value:
// one heap allocation per element. A batch claim encodes several arrays of
// a thousand elements, so those allocations were most of the consumer's
// per-message garbage. Array hands pgx a pointer to each element instead —
// a pointer fits in an interface without an allocation — and the element
// types implement pgx's valuer interfaces on their pointers, so pgx never
// dereferences them through reflection (which would box again).
package pgarray

import "github.com/jackc/pgx/v5/pgtype"

// Array is a slice passed to pgx as a one-dimensional array, element by
// pointer. T is Text, Bytes or Int8.
type Array[T any] []T

// Dimensions implements pgtype.ArrayGetter.
func (a Array[T]) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index implements pgtype.ArrayGetter.
func (a Array[T]) Index(i int) any { return &a[i] }

// IndexType implements pgtype.ArrayGetter.
func (a Array[T]) IndexType() any { return new(T) }

// Text is an element of a text[] parameter.
type Text string

// TextValue implements pgtype.TextValuer.
func (t *Text) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*t), Valid: true}, nil
}

// Bytes is an element of a bytea[] parameter.
type Bytes []byte

// BytesValue implements pgtype.BytesValuer.
func (b *Bytes) BytesValue() ([]byte, error) { return *b, nil }

// Int8 is an element of a bigint[] parameter.
type Int8 int64

// Int64Value implements pgtype.Int64Valuer.
func (v *Int8) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*v), Valid: true}, nil
}
