package engine

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// sqlFault says whose fault a Postgres error is, read from its SQLSTATE
// (and its severity): the answer decides whether a message's failure
// counts, is final, or is no failure of the message at all.
type sqlFault uint8

const (
	// faultHandlers means the handler's statement failed for a reason of its
	// own (a syntax error, a missing table while a deploy is in progress,
	// a missing foreign-key parent that may still arrive, a cancelled
	// statement): an attempt that counts, as any error a handler returns.
	faultHandlers sqlFault = iota
	// faultMessages means the statement will fail the same way for the same
	// data; retrying cannot help.
	faultMessages
	// faultDatabases means the database, not the statement, failed (it is out
	// of disk or memory, shutting down, broken, or its session ended), or
	// the transaction lost a race: no message is to blame, and the whole
	// transaction runs again, however often, counting no attempt.
	faultDatabases
)

// sqlFaultOf sorts a Postgres error by its SQLSTATE class (the first two
// characters), then by the codes within a class that differ from the
// rest of it. Every class of PostgreSQL's table ("PostgreSQL Error
// Codes") is named here; one not named (a new one, or a code of an
// extension or a trigger of the user's, like kafkaonce's own KO class)
// is the handler's.
func sqlFaultOf(pgErr *pgconn.PgError) sqlFault {
	// A FATAL or PANIC error ends the session whatever its code (an
	// idle-in-transaction, transaction or idle-session timeout, a
	// terminated backend): the connection is gone, not the message.
	if pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC" ||
		pgErr.SeverityUnlocalized == "FATAL" || pgErr.SeverityUnlocalized == "PANIC" {
		return faultDatabases
	}
	code := pgErr.Code
	if len(code) != 5 {
		return faultHandlers
	}
	if f, ok := sqlCodeFaults[code]; ok {
		return f
	}
	return sqlClassFaults[code[:2]]
}

// sqlCodeFaults are the codes whose fault is not their class's.
var sqlCodeFaults = map[string]sqlFault{
	// Class 23: a missing foreign-key parent may simply not have arrived
	// yet (it comes on another partition, or topic).
	"23503": faultHandlers, // foreign_key_violation
	// Class 25: the session ended (they come FATAL). A read-only
	// transaction (25006) met by a batch's opening statements is a
	// read-only standby's, and a failure to begin is the database's
	// whatever its code; once the batch has written, only a statement of
	// the handler's can have made it read only (set_config, say), and a
	// retry would do the same: the handler's, counted.
	"25P03": faultDatabases, // idle_in_transaction_session_timeout
	"25P04": faultDatabases, // transaction_timeout (Postgres 17)
	// Class 40: an integrity violation found at COMMIT is the data's.
	"40002": faultMessages, // transaction_integrity_constraint_violation
	// Class 55: a lock wait that timed out lost a race (see isContention).
	"55P03": faultDatabases, // lock_not_available
	// Class 57: a statement cancelled is what StatementTimeout raises; a
	// statement that runs too long counts, so that the limit means
	// something (and an operator's pg_cancel_backend says the same).
	"57014": faultHandlers, // query_canceled
	// Class 53: a limit of the server's configuration that one statement
	// exceeds (temp_file_limit) is a bound on the statement, as
	// StatementTimeout is: it counts.
	"53400": faultHandlers, // configuration_limit_exceeded
}

// sqlClassFaults is the fault of each SQLSTATE class; a class not listed
// is the handler's.
var sqlClassFaults = map[string]sqlFault{
	"00": faultHandlers,  // successful_completion
	"01": faultHandlers,  // warning
	"02": faultHandlers,  // no_data
	"03": faultHandlers,  // sql_statement_not_yet_complete
	"08": faultDatabases, // connection_exception
	"09": faultHandlers,  // triggered_action_exception
	"0A": faultHandlers,  // feature_not_supported
	"0B": faultHandlers,  // invalid_transaction_initiation
	"0F": faultHandlers,  // locator_exception
	"0L": faultHandlers,  // invalid_grantor
	"0P": faultHandlers,  // invalid_role_specification
	"0Z": faultHandlers,  // diagnostics_exception
	"20": faultHandlers,  // case_not_found
	"21": faultHandlers,  // cardinality_violation
	"22": faultMessages,  // data_exception: invalid text, numbers out of range, untranslatable characters
	"23": faultMessages,  // integrity_constraint_violation
	"24": faultHandlers,  // invalid_cursor_state
	"25": faultHandlers,  // invalid_transaction_state: in_failed_sql_transaction, say (a statement after an ignored error)
	"26": faultHandlers,  // invalid_sql_statement_name
	"27": faultHandlers,  // triggered_data_change_violation
	"28": faultHandlers,  // invalid_authorization_specification: a login refused; the consumer's own connections failing to begin are the database's whatever the code, so this is a connection of the handler's own
	"2B": faultHandlers,  // dependent_privilege_descriptors_still_exist
	"2D": faultHandlers,  // invalid_transaction_termination
	"2F": faultHandlers,  // sql_routine_exception
	"34": faultHandlers,  // invalid_cursor_name
	"38": faultHandlers,  // external_routine_exception
	"39": faultHandlers,  // external_routine_invocation_exception
	"3B": faultHandlers,  // savepoint_exception
	"3D": faultHandlers,  // invalid_catalog_name: a database the statement names (has_database_privilege, a handler's own pool) is not there
	"3F": faultHandlers,  // invalid_schema_name
	"40": faultDatabases, // transaction_rollback: serialization failures, deadlocks, a statement whose completion is unknown
	"42": faultHandlers,  // syntax_error_or_access_rule_violation: a deploy in progress may fix it
	"44": faultMessages,  // with_check_option_violation: the row's data
	"53": faultDatabases, // insufficient_resources: disk full, out of memory, too many connections (but 53400)
	"54": faultMessages,  // program_limit_exceeded: a value, row or statement too large
	"55": faultHandlers,  // object_not_in_prerequisite_state
	"57": faultDatabases, // operator_intervention: admin or crash shutdown, cannot connect now, database dropped
	"58": faultDatabases, // system_error: I/O errors, files missing
	"72": faultDatabases, // snapshot_failure: snapshot too old
	"F0": faultDatabases, // config_file_error
	"HV": faultHandlers,  // fdw_error: the foreign server the handler reads is the handler's partner
	"P0": faultHandlers,  // plpgsql_error: RAISE EXCEPTION of a function of the user's
	"XX": faultDatabases, // internal_error: data or an index corrupted, an internal error
}

// readOnlyTransaction is read_only_sql_transaction (see sqlCodeFaults).
const readOnlyTransaction = "25006"

// sqlFaultIn is the fault of the Postgres error in err's chain; ok is
// false when there is none.
func sqlFaultIn(err error) (f sqlFault, ok bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return faultHandlers, false
	}
	return sqlFaultOf(pgErr), true
}
