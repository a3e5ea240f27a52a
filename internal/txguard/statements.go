package txguard

import "strings"

// A handler's SQL text is scanned, before it is sent, for statements that
// would end or reshape the transaction it runs in. One text may hold
// several statements (the simple protocol runs "ROLLBACK; INSERT …" as
// two, the second outside any transaction), so every statement is looked
// at, and the scan follows PostgreSQL's lexical rules for what can hide a
// semicolon or a keyword: quoted strings (with the E'' and U&'' forms),
// quoted identifiers, dollar quoting, line and nested block comments.
//
// Whether a backslash escapes a quote in a plain '…' string depends on the
// session's standard_conforming_strings, which the guard does not know, so
// the text is scanned both ways and a statement found either way counts: a
// text that is ambiguous is refused, never let through.

// verdict is what a scan found in a text.
type verdict struct {
	// control is the first statement that controls the transaction, by its
	// leading words ("COMMIT", "PREPARE TRANSACTION"); "" for none.
	control string
	// constraints means the text sets the mode of deferred constraints (SET
	// CONSTRAINTS), which fires the deferred checks it makes immediate.
	constraints bool
	// statements counts the statements that are not empty.
	statements int
	// pgxDiverges means pgx's own lexer, which puts arguments into the text for
	// the simple protocol, would find a string or a parameter where the
	// server does not (see readsAlikeToPgx).
	pgxDiverges bool
	// open means the text ends inside a string, a quoted identifier or a block
	// comment, read either way; openStandard: read with
	// standard_conforming_strings on, which pgx's simple protocol needs.
	open, openStandard bool
}

// scan looks at every statement of sql.
func scan(sql string) verdict {
	// The common text (no quote, no backslash) reads the same both ways.
	v := scanWith(sql, false)
	v.openStandard = v.open
	if v.control == "" && strings.IndexByte(sql, '\\') >= 0 {
		other := scanWith(sql, true)
		v.control = other.control
		v.constraints = v.constraints || other.constraints
		v.statements = max(v.statements, other.statements)
		v.open = v.open || other.open
	}
	return v
}

// scanWith scans sql, with backslashes escaping in plain strings or not.
func scanWith(sql string, backslashes bool) verdict {
	l := lexer{s: sql, backslashes: backslashes}
	var v verdict
	for {
		lead, tokens, more := l.statement()
		if tokens {
			v.statements++
		}
		v.pgxDiverges = v.pgxDiverges || l.pgxDiverges
		v.open = l.open
		switch kind := classify(lead); {
		case kind == "SET CONSTRAINTS":
			v.constraints = true
		case kind != "" && v.control == "":
			v.control = kind
		}
		if !more {
			return v
		}
	}
}

// classify names the statement whose leading words are lead: a statement
// that controls the transaction, "SET CONSTRAINTS", or "" for any other.
func classify(lead []string) string {
	word := func(i int) string {
		if i < len(lead) {
			return lead[i]
		}
		return ""
	}
	switch word(0) {
	case "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE":
		return word(0)
	case "PREPARE":
		if word(1) == "TRANSACTION" {
			return "PREPARE TRANSACTION"
		}
	case "SET":
		if word(1) == "CONSTRAINTS" {
			return "SET CONSTRAINTS"
		}
		// SET LOCAL and SET SESSION take every form SET does (gram.y:
		// VariableSetStmt), these two included.
		rest := 1
		if word(1) == "LOCAL" || word(1) == "SESSION" && word(2) != "CHARACTERISTICS" {
			rest = 2
		}
		switch {
		case word(rest) == "TRANSACTION":
			return "SET TRANSACTION"
		case word(rest) == "SESSION" && word(rest+1) == "CHARACTERISTICS":
			return "SET SESSION CHARACTERISTICS"
		case word(rest) == "TRANSACTION_READ_ONLY", word(rest) == "TRANSACTION_ISOLATION", word(rest) == "TRANSACTION_DEFERRABLE",
			word(rest) == "DEFAULT_TRANSACTION_READ_ONLY":
			// The settings behind SET TRANSACTION, refused as it is: a
			// transaction made read only fails the consumer's closing
			// statements (25006, the message's failure then), and the
			// default would make every later transaction of the pooled
			// connection read only, which a batch's begin cannot tell from
			// a standby's.
			return "SET " + word(rest)
		case word(rest) == "SESSION_REPLICATION_ROLE":
			// replica turns off the triggers that check a transaction at
			// COMMIT (foreign keys, the commit checks) for rows written after.
			return "SET SESSION_REPLICATION_ROLE"
		}
	}
	return ""
}

// lexer walks a text statement by statement.
type lexer struct {
	s           string
	i           int
	backslashes bool
	pgxDiverges bool
	open        bool // the text ended inside a quote or a block comment
}

// leadWords is how many of a statement's first words decide what it is.
const leadWords = 4

// statement reads one statement, up to its semicolon or the end of the
// text, and returns its leading words, upper-cased (only while the
// statement starts with words: "(SELECT …" has none), whether it had any
// token, and whether another statement follows.
func (l *lexer) statement() (lead []string, tokens, more bool) {
	words := true // every token so far was a word
	token := func(word string) {
		tokens = true
		if words && len(lead) < leadWords && word != "" {
			lead = append(lead, strings.ToUpper(word))
			return
		}
		words = false
	}
	for l.i < len(l.s) {
		c := l.s[l.i]
		switch {
		case c == ';':
			l.i++
			return lead, tokens, true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			l.i++
		case strings.HasPrefix(l.s[l.i:], "--"):
			l.lineComment()
		case strings.HasPrefix(l.s[l.i:], "/*"):
			l.blockComment()
		case c == '\'':
			l.quoted('\'', l.backslashes)
			token("")
		case c == '"':
			l.quoted('"', false)
			token("")
		case c == '$':
			l.dollar()
			token("")
		case identStart(c):
			word := l.ident()
			l.notePgxDivergence(word)
			if l.stringPrefix(word) {
				token("")
				continue
			}
			token(word)
		case digit(c):
			for l.i < len(l.s) && (digit(l.s[l.i]) || l.s[l.i] == '.') {
				l.i++
			}
			token("")
		default: // an operator or punctuation
			l.i++
			token("")
		}
	}
	return lead, tokens, false
}

// stringPrefix reads the string a prefix (E'…', B'…', X'…', N'…', U&'…',
// U&"…") starts, when word, just read, is one.
func (l *lexer) stringPrefix(word string) bool {
	rest := l.s[l.i:]
	switch {
	case len(word) != 1:
		return false
	case (word == "e" || word == "E") && strings.HasPrefix(rest, "'"):
		if l.quoted('\'', true) {
			// pgx reads the continued part as a plain string: a backslash
			// there ends it where the server does not.
			l.pgxDiverges = true
		}
	case strings.ContainsAny(word, "bBxXnN") && strings.HasPrefix(rest, "'"):
		l.quoted('\'', l.backslashes)
	case (word == "u" || word == "U") && (strings.HasPrefix(rest, "&'") || strings.HasPrefix(rest, "&\"")):
		l.i++
		l.quoted(l.s[l.i], l.s[l.i] == '\'' && l.backslashes)
	default:
		return false
	}
	return true
}

// quoted reads a quoted string or identifier from its opening quote q to
// its closing one; a doubled quote is one quote, and with backslashes a
// backslash escapes the byte after it. A string goes on, in the same
// mode, past a closing quote followed by whitespace holding a line break
// and another quote ('a'\n'b' is the one string "ab"): continued reports
// that it did. An unterminated one runs to the end (the server refuses
// the text).
func (l *lexer) quoted(q byte, backslashes bool) (continued bool) {
	l.i++
	for l.i < len(l.s) {
		switch c := l.s[l.i]; {
		case backslashes && c == '\\':
			l.i += 2
		case c == q && l.i+1 < len(l.s) && l.s[l.i+1] == q:
			l.i += 2
		case c == q:
			l.i++
			if q != '\'' {
				return continued
			}
			next, ok := l.continuation()
			if !ok {
				return continued
			}
			l.i, continued = next+1, true
		default:
			l.i++
		}
	}
	l.i = len(l.s)
	l.open = true
	return continued
}

// continuation reports whether a string that just closed goes on: what
// follows is whitespace holding a line break and then a quote, whose index
// it returns. Line comments count as whitespace on either side of the
// break, each running to a line break. As PostgreSQL's scanner has it
// (scan.l: whitespace_with_newline, then quotecontinue).
func (l *lexer) continuation() (quote int, ok bool) {
	j := l.i
	broken := false // the line break was met
	for j < len(l.s) {
		switch c := l.s[j]; {
		case c == ' ' || c == '\t' || c == '\f':
			j++
		case c == '\n' || c == '\r':
			broken = true
			j++
		case broken && c == '\v':
			j++
		case strings.HasPrefix(l.s[j:], "--"):
			end := strings.IndexAny(l.s[j:], "\r\n")
			if end < 0 {
				return 0, false // the text ends in the comment
			}
			j += end
		case c == '\'' && broken:
			return j, true
		default:
			return 0, false
		}
	}
	return 0, false
}

// dollar reads what starts with '$': a parameter ($1), or a dollar-quoted
// string ($$…$$, $tag$…$tag$) to its closing tag.
func (l *lexer) dollar() {
	start := l.i
	l.i++
	if l.i < len(l.s) && digit(l.s[l.i]) {
		for l.i < len(l.s) && digit(l.s[l.i]) {
			l.i++
		}
		return
	}
	j := l.i
	if j < len(l.s) && identStart(l.s[j]) {
		j++
		for j < len(l.s) && (identStart(l.s[j]) || digit(l.s[j])) {
			j++
		}
	}
	if j >= len(l.s) || l.s[j] != '$' {
		return // a lone '$': not a quote
	}
	l.i = j
	l.i++
	tag := l.s[start:l.i]
	if strings.Contains(tag, "\uFFFD") {
		l.pgxDiverges = true // pgx takes U+FFFD for a byte it cannot decode: no tag to it
	}
	if end := strings.Index(l.s[l.i:], tag); end >= 0 {
		l.i += end + len(tag)
		return
	}
	l.i = len(l.s)
	l.open = true
}

// lineComment reads a comment from "--" to the end of its line.
func (l *lexer) lineComment() {
	for l.i < len(l.s) && l.s[l.i] != '\n' && l.s[l.i] != '\r' {
		l.i++
	}
}

// blockComment reads a comment from "/*" to its "*/"; they nest.
func (l *lexer) blockComment() {
	depth := 0
	for l.i < len(l.s) {
		switch {
		case strings.HasPrefix(l.s[l.i:], "/*"):
			depth++
			l.i += 2
		case strings.HasPrefix(l.s[l.i:], "*/"):
			depth--
			l.i += 2
			if depth == 0 {
				return
			}
		default:
			l.i++
		}
	}
	l.open = true
}

// ident reads an identifier or keyword.
func (l *lexer) ident() string {
	start := l.i
	for l.i < len(l.s) && identPart(l.s[l.i]) {
		l.i++
	}
	return l.s[start:l.i]
}

// identStart and identPart are PostgreSQL's identifier bytes (any byte
// above 0x7F is a letter to it).
func identStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func identPart(c byte) bool { return identStart(c) || digit(c) || c == '$' }

func digit(c byte) bool { return c >= '0' && c <= '9' }

// notePgxDivergence notes whether word, an identifier just read, is where
// pgx's lexer parts from the server's. pgx starts an E'…' string at any e
// before a quote, and a dollar quote at any $ not before a digit, also
// inside an identifier: to it, name'…' and a$q$ open strings that the
// server does not see.
func (l *lexer) notePgxDivergence(word string) {
	last := word[len(word)-1]
	if len(word) > 1 && (last == 'e' || last == 'E') && strings.HasPrefix(l.s[l.i:], "'") {
		l.pgxDiverges = true
	}
	for j := strings.IndexByte(word, '$'); j >= 0; j = strings.IndexByte(word, '$') {
		if j+1 == len(word) || !digit(word[j+1]) {
			l.pgxDiverges = true
		}
		word = word[j+1:]
	}
}
