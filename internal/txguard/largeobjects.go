package txguard

import (
	"reflect"
	"unsafe"

	"github.com/jackc/pgx/v5"
)

// LargeObjects returns pgx's large-object API on the guarded transaction:
// its statements go through t, so a value the handler keeps (a
// LargeObjects, or a LargeObject it opened) refuses every use once the
// call is over, as t does.
//
// pgx builds a LargeObjects only for a transaction of its own, and one
// bound to the pooled connection's would outlive the call: what a
// goroutine left behind wrote with it would commit in whatever
// transaction held the connection next, or in none. A pgx.LargeObjects is
// the transaction its statements go to, and nothing else (checked once:
// boundLargeObjects), so the guard builds one around itself. Should pgx
// ever make it anything else, the guard hands out the zero value, whose
// methods fail (a nil transaction: a panic, which the caller recovers as
// the handler's) rather than reach the connection.
func (t *Tx) LargeObjects() pgx.LargeObjects {
	if !boundLargeObjects {
		return pgx.LargeObjects{}
	}
	var tx pgx.Tx = t
	return *(*pgx.LargeObjects)(unsafe.Pointer(&tx))
}

// boundLargeObjects reports whether pgx.LargeObjects is a pgx.Tx alone, so
// that one can be made from any transaction.
var boundLargeObjects = func() bool {
	lo := reflect.TypeFor[pgx.LargeObjects]()
	return lo.NumField() == 1 && lo.Field(0).Type == reflect.TypeFor[pgx.Tx]() &&
		lo.Size() == reflect.TypeFor[pgx.Tx]().Size()
}()
