package txguard

import "strings"

// The guard sends every text as one Parse message (see the package
// documentation), which the server parses as one statement at most, so
// what the statement does is decided by its leading words: the first
// keywords the server reads, after whitespace, comments and empty
// statements (";"). No client encoding can disguise them. A keyword is
// ASCII; so are whitespace, the comment marks and the semicolon, and none
// of these bytes can be the second byte of a character in any client
// encoding PostgreSQL accepts, except ";" in JOHAB, which the reading
// skips only where no byte could start a character before it (inside a
// comment it is part of the comment either way). A text whose leading
// bytes are anything else (a byte of a multibyte character, a quote) has
// no leading keyword for the guard, and the server reads no keyword there
// either: it reads an identifier, a string, or an error.

// leadWords is how many of a statement's first words decide what it is.
const leadWords = 4

// leading returns up to n of the leading words of sql, upper-cased. The
// words stop at the first token that is not a word.
func leading(sql string, n int) []string {
	var words []string
	i := skipSpace(sql, 0, true)
	for len(words) < n && i < len(sql) && wordStart(sql[i]) {
		j := i + 1
		for j < len(sql) && wordPart(sql[j]) {
			j++
		}
		words = append(words, strings.ToUpper(sql[i:j]))
		i = skipSpace(sql, j, false)
	}
	return words
}

// skipSpace returns where the first token at or after i starts: past
// whitespace and comments, and, before a statement's first word, empty
// statements. Every byte up to and including a space PostgreSQL's lexer
// skips (its whitespace is a subset) is skipped, so a byte read as a
// token here is never whitespace to the server.
func skipSpace(s string, i int, semicolons bool) int {
	for i < len(s) {
		switch c := s[i]; {
		case c <= ' ', semicolons && c == ';':
			i++
		case strings.HasPrefix(s[i:], "--"):
			for i < len(s) && s[i] != '\n' && s[i] != '\r' {
				i++
			}
		case strings.HasPrefix(s[i:], "/*"):
			i = blockCommentEnd(s, i)
		default:
			return i
		}
	}
	return i
}

// blockCommentEnd returns where the block comment starting at i ends;
// block comments nest.
func blockCommentEnd(s string, i int) int {
	depth := 0
	for i < len(s) {
		switch {
		case strings.HasPrefix(s[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(s[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return i
}

// wordStart and wordPart are PostgreSQL's identifier bytes (scan.l:
// ident_start, ident_cont).
func wordStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func wordPart(c byte) bool { return wordStart(c) || c >= '0' && c <= '9' || c == '$' }

// statementKind is what a statement is to the guard, by its leading words.
type statementKind struct {
	// control names a statement that controls the transaction ("COMMIT",
	// "PREPARE TRANSACTION"), which the guard refuses; "" for any other.
	control string
	// constraints means SET CONSTRAINTS, which fires the deferred checks
	// it makes immediate (the commit check's among them).
	constraints bool
}

// kindOf classifies sql's one statement.
func kindOf(sql string) statementKind {
	lead := leading(sql, leadWords)
	word := func(i int) string {
		if i < len(lead) {
			return lead[i]
		}
		return ""
	}
	switch word(0) {
	case "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE":
		return statementKind{control: word(0)}
	case "PREPARE":
		if word(1) == "TRANSACTION" {
			return statementKind{control: "PREPARE TRANSACTION"}
		}
	case "SET":
		if word(1) == "CONSTRAINTS" {
			return statementKind{constraints: true}
		}
		// SET LOCAL and SET SESSION take every form SET does (gram.y:
		// VariableSetStmt), these included.
		rest := 1
		if word(1) == "LOCAL" || word(1) == "SESSION" && word(2) != "CHARACTERISTICS" {
			rest = 2
		}
		switch name := word(rest); {
		case name == "TRANSACTION":
			return statementKind{control: "SET TRANSACTION"}
		case name == "SESSION" && word(rest+1) == "CHARACTERISTICS":
			return statementKind{control: "SET SESSION CHARACTERISTICS"}
		case name == "TRANSACTION_READ_ONLY", name == "TRANSACTION_ISOLATION", name == "TRANSACTION_DEFERRABLE",
			name == "DEFAULT_TRANSACTION_READ_ONLY":
			// The settings behind SET TRANSACTION, refused as it is: a
			// transaction made read only fails kafkaonce's closing
			// statements, and the default would make every later
			// transaction of the pooled connection read only. The server
			// stops what this misses (set_config, a quoted name): the
			// closing statements fail, 25006.
			return statementKind{control: "SET " + name}
		case name == "SESSION_REPLICATION_ROLE":
			// replica turns off the triggers that check a transaction at
			// COMMIT. The server checks it at the close too.
			return statementKind{control: "SET SESSION_REPLICATION_ROLE"}
		}
	}
	return statementKind{}
}
