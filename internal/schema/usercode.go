package schema

// A transaction kafkaonce lends to user code (a handler, a phase of an
// HTTP request) records at its start what kafkaonce's own statements need
// of the session, and has the server check it once the user code is done
// (migration 022): a handler may send any statement, one at a time, and
// some of them change the session (the client encoding, the search path,
// the role) in ways that would change what kafkaonce's statements after
// it mean.

// SessionChanged is the SQLSTATE after_user_code raises when user code
// left the session unfit for kafkaonce's statements: a client encoding
// other than UTF8, standard_conforming_strings off, a
// session_replication_role other than origin, a search_path that puts a
// schema before pg_catalog, another session user. The transaction can
// never commit; it is the user code's failure.
const SessionChanged = "KO005"

// BeganAs is a list of expressions, for a SELECT among a transaction's
// first statements, that keeps the role and the session user the
// transaction began with in its settings, for after_user_code to check
// and put back. Every name in it is pg_catalog's.
const BeganAs = `pg_catalog.set_config('kafkaonce.role', pg_catalog.current_setting('role'), true), ` +
	`pg_catalog.set_config('kafkaonce.session_user', session_user, true)`

// AfterUserCode is the statement to send first once user code is done
// with a transaction of the schema's, before any that names or writes
// anything of kafkaonce's: it fails with SessionChanged when the session
// is not as those statements need it, and puts back the role the
// transaction began with. It takes no arguments: none of its text is
// read in the client encoding user code may have set.
func AfterUserCode(schemaName string) string {
	return `SELECT ` + Table(schemaName, "after_user_code") + `(pg_catalog.current_schemas(true))`
}

// AsBegan is the statement that switches to the role the transaction began
// with, keeping the handler's, and AsHandler the one that switches back:
// what kafkaonce runs in the middle of a handler's work (the commit check
// lifted around its SET CONSTRAINTS) runs between them, as the
// transaction began, whatever role the handler set.
func AsBegan(schemaName string) string { return `SELECT ` + Table(schemaName, "as_began") + `()` }

// AsHandler: see AsBegan.
func AsHandler(schemaName string) string { return `SELECT ` + Table(schemaName, "as_handler") + `()` }
