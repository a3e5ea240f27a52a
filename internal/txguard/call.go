package txguard

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A call's text is read as pgx will send it. pgx lets the first arguments
// be options, and one of them may be a QueryRewriter (pgx.NamedArgs is
// one) that replaces the text and the arguments before anything is sent;
// the guard applies it first, as pgx would, and hands pgx the result. With
// the simple protocol, pgx then writes the arguments into the text on the
// client (see readsAlikeToPgx).

// call is a statement as pgx will send it.
type call struct {
	sql string
	// args are the options pgx reads (a mode, result formats) followed by
	// the arguments; no QueryRewriter is left among the options.
	args []any
	// params is how many of args are the statement's arguments.
	params int
	// mode is the call's own QueryExecMode, when explicit.
	mode     pgx.QueryExecMode
	explicit bool
}

// inText reports whether pgx will write the arguments into the text: the
// simple protocol, with arguments. defaultMode is the connection's mode,
// asked only when the call has none of its own.
func (c call) inText(defaultMode func() pgx.QueryExecMode) bool {
	if c.params == 0 {
		return false
	}
	mode := c.mode
	if !c.explicit {
		mode = defaultMode()
	}
	return mode == pgx.QueryExecModeSimpleProtocol
}

// maxRewrites bounds how many times a rewriter may return another one.
const maxRewrites = 8

var errRewritesLoop = fmt.Errorf("the query's QueryRewriter returned arguments led by another QueryRewriter more than %d times: refused", maxRewrites)

// resolve applies the QueryRewriter among the leading options of args to
// sql, as pgx does, until none is left. In a batch, pgx reads no option
// but a rewriter. conn is asked for only when there is a rewriter to give
// it to: a batch handler's transaction opens at its first use.
func resolve(ctx context.Context, conn func() *pgx.Conn, sql string, args []any, batch bool) (call, error) {
	for range maxRewrites {
		var rewriter pgx.QueryRewriter
		var options []any
		c := call{sql: sql, args: args}
		i := 0
	options:
		for ; i < len(args); i++ {
			if r, ok := args[i].(pgx.QueryRewriter); ok {
				rewriter = r
				continue
			}
			if batch {
				break // a batch reads no other option: it is an argument
			}
			switch m := args[i].(type) {
			case pgx.QueryExecMode:
				c.mode, c.explicit = m, true
			case pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			default:
				break options
			}
			options = append(options, args[i])
		}
		params := args[i:]
		if rewriter == nil {
			c.params = len(params)
			return c, nil
		}
		cn := conn()
		if cn == nil {
			return call{}, errors.New("a QueryRewriter needs the transaction's connection, and there is none")
		}
		rewritten, rewrittenArgs, err := rewriter.RewriteQuery(ctx, cn, sql, params)
		if err != nil {
			return call{}, fmt.Errorf("rewrite query failed: %w", err)
		}
		sql, args = rewritten, append(options, rewrittenArgs...)
	}
	return call{}, errRewritesLoop
}
