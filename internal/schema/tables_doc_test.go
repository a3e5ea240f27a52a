package schema_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// tablesDoc is the reference page of the tables users query, relative to
// this package's directory (where go test runs it).
const tablesDoc = "../../docs/tables.md"

// The page must describe the schema the migrations make, column by
// column: users write queries from it, so a column it does not name, or
// names with the wrong type, is a query that fails, or worse, one that
// runs and means something else. Every table, every column with its type
// and nullability, every primary key and every function of a freshly
// migrated schema is compared with the page, and each difference is
// reported with the line to add, change or remove.
func TestTablesDocMatchesTheMigrations(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	raw, err := os.ReadFile(tablesDoc)
	require.NoError(t, err)
	for _, p := range docProblems(string(raw), readSchema(t, db)) {
		t.Error(p)
	}
}

// The comparison finds each kind of drift: were it to miss one, the test
// above would pass on a page that lies. The page is the real one, changed
// the ways a forgotten edit would leave it.
func TestTablesDocCheckFindsDrift(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	raw, err := os.ReadFile(tablesDoc)
	require.NoError(t, err)
	doc, facts := string(raw), readSchema(t, db)
	require.Empty(t, docProblems(doc, facts), "the real page must match before it is spoiled")

	edit := func(t *testing.T, old, new string) string {
		t.Helper()
		require.Equal(t, 1, strings.Count(doc, old), "the page should hold %q once", old)
		return strings.Replace(doc, old, new, 1)
	}
	for _, tc := range []struct {
		name string
		doc  func(t *testing.T) string
		want string
	}{
		{"a column left out", func(t *testing.T) string {
			return edit(t, "| `settled_at` | `timestamp with time zone` | null | when an operator settled the letter instead of redriving it; a settled letter is never redriven |\n", "")
		}, "dead_letters.settled_at (timestamp with time zone, null) is not in docs/tables.md: add a row"},
		{"a column that is gone", func(t *testing.T) string {
			return edit(t, "| `taken` |", "| `gone` | `text` | null | dropped long ago |\n| `taken` |")
		}, "idempotency_keys.gone is in docs/tables.md but not in the schema: remove its row"},
		{"a wrong type", func(t *testing.T) string {
			return edit(t, "| `next_offset` | `bigint` |", "| `next_offset` | `integer` |")
		}, "consumer_offsets.next_offset: docs/tables.md says integer, the schema has bigint"},
		{"a wrong nullability", func(t *testing.T) string {
			return edit(t, "| `message_id` | `text` | null | its id; NULL when no valid id", "| `message_id` | `text` | not null | its id; NULL when no valid id")
		}, "dead_letters.message_id: docs/tables.md says not null, the schema has null"},
		{"a table left out", func(t *testing.T) string {
			return edit(t, "## `open_batches`", "## open batches")
		}, "table open_batches has no section in docs/tables.md: add"},
		{"a table left out of the list", func(t *testing.T) string {
			return edit(t, "| [`suspect_duplicates`](#suspect_duplicates) |", "| suspects |")
		}, "table suspect_duplicates is not in the list at the top of docs/tables.md"},
		{"a wrong primary key", func(t *testing.T) string {
			return edit(t, "Primary key: `(consumer_id, message_id)`.", "Primary key: `(message_id)`.")
		}, "processed_messages: docs/tables.md says primary key (message_id), the schema has (consumer_id, message_id)"},
		{"a function left out", func(t *testing.T) string {
			return edit(t, "| `expect_claimed` |", "| expect claimed |")
		}, "function expect_claimed is not in the Functions table of docs/tables.md"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := docProblems(tc.doc(t), facts)
			require.NotEmpty(t, got)
			require.Truef(t, slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, tc.want) }),
				"want a problem containing %q, got:\n%s", tc.want, strings.Join(got, "\n"))
		})
	}
}

// column is a column as the page or the schema describes it.
type column struct {
	typ     string // as format_type names it
	notNull bool
}

func (c column) String() string {
	if c.notNull {
		return c.typ + ", not null"
	}
	return c.typ + ", null"
}

// schemaFacts is what the page describes, of a schema or of the page.
type schemaFacts struct {
	tables    map[string]map[string]column
	order     map[string][]string // each table's columns in their order
	keys      map[string]string   // table -> "(a, b)"
	functions []string
	listed    []string // tables in the list at the top (the page only)
}

// readSchema reads the tables (and views, if any), their columns, primary
// keys and the functions of db's schema from the catalogue.
func readSchema(t *testing.T, db *testenv.DB) schemaFacts {
	t.Helper()
	ctx := context.Background()
	f := schemaFacts{tables: map[string]map[string]column{}, order: map[string][]string{}, keys: map[string]string{}}
	rows, err := db.Pool.Query(ctx, `SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
ORDER BY c.relname, a.attnum`, db.Schema)
	require.NoError(t, err)
	for rows.Next() {
		var table, name string
		var c column
		require.NoError(t, rows.Scan(&table, &name, &c.typ, &c.notNull))
		if f.tables[table] == nil {
			f.tables[table] = map[string]column{}
		}
		f.tables[table][name] = c
		f.order[table] = append(f.order[table], name)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, f.tables, "the migrated schema %s has no tables", db.Schema)

	rows, err = db.Pool.Query(ctx, `SELECT c.relname, '(' || string_agg(a.attname, ', ' ORDER BY k.ord) || ')'
FROM pg_catalog.pg_index AS i
JOIN pg_catalog.pg_class AS c ON c.oid = i.indrelid
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE n.nspname = $1 AND i.indisprimary
GROUP BY c.relname`, db.Schema)
	require.NoError(t, err)
	for rows.Next() {
		var table, key string
		require.NoError(t, rows.Scan(&table, &key))
		f.keys[table] = key
	}
	require.NoError(t, rows.Err())

	rows, err = db.Pool.Query(ctx, `SELECT DISTINCT p.proname FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = $1 ORDER BY 1`, db.Schema)
	require.NoError(t, err)
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		f.functions = append(f.functions, name)
	}
	require.NoError(t, rows.Err())
	return f
}

var (
	// A table's section: its heading is the table's name and nothing else.
	tableHeading = regexp.MustCompile("^## `([a-z_][a-z0-9_]*)`$")
	// A row of a section's column table: | `name` | `type` | null | meaning |
	columnRow  = regexp.MustCompile("^\\| `([a-z_][a-z0-9_]*)` \\| `([^`]+)` \\| (null|not null) \\| .+\\|$")
	primaryKey = regexp.MustCompile("Primary key: `(\\([^`]*\\))`")
	// A row of the list at the top: | [`name`](#name) | ...
	listedTable = regexp.MustCompile("^\\| \\[`([a-z_][a-z0-9_]*)`\\]\\(#[a-z_0-9]+\\) \\|")
	// A row of the Functions table: | `name` | what |
	functionRow = regexp.MustCompile("^\\| `([a-z_][a-z0-9_]*)` \\| [^|]+\\|$")
)

// parseDoc reads the page: the list at the top, each table's section with
// its column rows and primary key, and the Functions table. Problems of
// the page's own making (a column twice, a row that does not parse) are
// returned with it.
func parseDoc(doc string) (schemaFacts, []string) {
	f := schemaFacts{tables: map[string]map[string]column{}, order: map[string][]string{}, keys: map[string]string{}}
	var problems []string
	section, inFunctions := "", false
	for n, line := range strings.Split(doc, "\n") {
		where := fmt.Sprintf("docs/tables.md:%d", n+1)
		if strings.HasPrefix(line, "## ") {
			section, inFunctions = "", line == "## Functions"
			if m := tableHeading.FindStringSubmatch(line); m != nil {
				section = m[1]
				if f.tables[section] != nil {
					problems = append(problems, fmt.Sprintf("%s: a second section for table %s: merge them", where, section))
				}
				f.tables[section] = map[string]column{}
			}
			continue
		}
		switch {
		case section == "" && !inFunctions:
			if m := listedTable.FindStringSubmatch(line); m != nil {
				f.listed = append(f.listed, m[1])
			}
		case inFunctions:
			if m := functionRow.FindStringSubmatch(line); m != nil {
				f.functions = append(f.functions, m[1])
			}
		default:
			if m := primaryKey.FindStringSubmatch(line); m != nil {
				f.keys[section] = m[1]
			}
			if !strings.HasPrefix(line, "| `") {
				continue
			}
			m := columnRow.FindStringSubmatch(line)
			if m == nil {
				problems = append(problems, fmt.Sprintf("%s: a row of table %s that does not read as | `column` | `type` | null or not null | meaning |: %s", where, section, line))
				continue
			}
			if _, dup := f.tables[section][m[1]]; dup {
				problems = append(problems, fmt.Sprintf("%s: column %s.%s is documented twice: keep one row", where, section, m[1]))
			}
			f.tables[section][m[1]] = column{typ: m[2], notNull: m[3] == "not null"}
			f.order[section] = append(f.order[section], m[1])
		}
	}
	return f, problems
}

// docProblems compares the page with the schema and says, for each
// difference, what to change in the page.
func docProblems(doc string, db schemaFacts) []string {
	page, problems := parseDoc(doc)
	for _, table := range sortedKeys(db.tables) {
		cols := db.tables[table]
		documented, ok := page.tables[table]
		if !ok {
			var rows []string
			for _, name := range db.order[table] {
				rows = append(rows, docRow(name, cols[name]))
			}
			key := ""
			if db.keys[table] != "" {
				key = "\nand the line \"Primary key: `" + db.keys[table] + "`.\""
			}
			problems = append(problems, fmt.Sprintf("table %s has no section in docs/tables.md: add \"## `%s`\" saying what it is for, who writes it and who may read it, with the rows\n%s%s\nand a line for it in the list at the top",
				table, table, strings.Join(rows, "\n"), key))
			continue
		}
		for _, name := range db.order[table] {
			want := cols[name]
			got, ok := documented[name]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%s.%s (%s) is not in docs/tables.md: add a row to the section of %s:\n%s", table, name, want, table, docRow(name, want)))
			case got.typ != want.typ:
				problems = append(problems, fmt.Sprintf("%s.%s: docs/tables.md says %s, the schema has %s: change the type in its row to `%s`", table, name, got.typ, want.typ, want.typ))
			case got.notNull != want.notNull:
				problems = append(problems, fmt.Sprintf("%s.%s: docs/tables.md says %s, the schema has %s: change its row (and the meaning, if it speaks of NULL)", table, name, nullText(got), nullText(want)))
			}
		}
		for _, name := range page.order[table] {
			if _, ok := cols[name]; !ok {
				problems = append(problems, fmt.Sprintf("%s.%s is in docs/tables.md but not in the schema: remove its row (or the migration lost a column)", table, name))
			}
		}
		if want, got := db.keys[table], page.keys[table]; want != got {
			switch {
			case want == "":
				problems = append(problems, fmt.Sprintf("%s: docs/tables.md says primary key %s, the schema has none: remove the line", table, got))
			case got == "":
				problems = append(problems, fmt.Sprintf("%s: docs/tables.md names no primary key, the schema has %s: add the line \"Primary key: `%s`.\"", table, want, want))
			default:
				problems = append(problems, fmt.Sprintf("%s: docs/tables.md says primary key %s, the schema has %s: change the line to \"Primary key: `%s`.\"", table, got, want, want))
			}
		}
		if !slices.Contains(page.listed, table) {
			problems = append(problems, fmt.Sprintf("table %s is not in the list at the top of docs/tables.md: add \"| [`%s`](#%s) | what it holds | what you do with it |\"", table, table, table))
		}
	}
	for _, table := range sortedKeys(page.tables) {
		if _, ok := db.tables[table]; !ok {
			problems = append(problems, fmt.Sprintf("table %s has a section in docs/tables.md but is not in the schema: remove the section (and its line in the list at the top)", table))
		}
	}
	for _, table := range page.listed {
		if _, ok := db.tables[table]; !ok {
			problems = append(problems, fmt.Sprintf("table %s is in the list at the top of docs/tables.md but not in the schema: remove its line", table))
		}
	}
	for _, fn := range db.functions {
		if !slices.Contains(page.functions, fn) {
			problems = append(problems, fmt.Sprintf("function %s is not in the Functions table of docs/tables.md: add \"| `%s` | what it does |\"", fn, fn))
		}
	}
	for _, fn := range page.functions {
		if !slices.Contains(db.functions, fn) {
			problems = append(problems, fmt.Sprintf("function %s is in the Functions table of docs/tables.md but not in the schema: remove its row", fn))
		}
	}
	return problems
}

// docRow is the row a column needs, its meaning left for a person to
// write.
func docRow(name string, c column) string {
	return fmt.Sprintf("| `%s` | `%s` | %s | (what it means) |", name, c.typ, nullText(c))
}

func nullText(c column) string {
	if c.notNull {
		return "not null"
	}
	return "null"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
