package schema

// MigrateTo exposes migrateTo to the package's tests.
var MigrateTo = migrateTo
