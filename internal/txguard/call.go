package txguard

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A call's text is read as pgx will send it. pgx lets the first arguments
// be options, and one of them may be a QueryRewriter (pgx.NamedArgs is
// one) that replaces the text and the arguments before anything is sent;
// the guard applies it first, as pgx would, and hands pgx the result.

// call is a statement as pgx will send it.
type call struct {
	sql string
	// options are those pgx reads (a mode, result formats), without the
	// QueryRewriter, which was applied.
	options []any
	// params are the statement's arguments.
	params []any
	// mode is the call's own QueryExecMode, when explicit.
	mode     pgx.QueryExecMode
	explicit bool
}

// args is what to hand pgx: the options, then the arguments.
func (c call) args() []any {
	if len(c.options) == 0 {
		return c.params
	}
	return append(append([]any(nil), c.options...), c.params...)
}

// extended is c with pgx told to send it in the extended protocol, as an
// unnamed statement with its arguments as text, when pgx would otherwise
// use the simple protocol, where a text may hold several statements:
// always for Exec without arguments, and for any call in
// QueryExecModeSimpleProtocol, the call's own or the connection's.
// QueryExecModeExec is the mode closest to the simple protocol (nothing
// prepared or cached, the server infers the arguments' types), and one
// that works behind a PgBouncer in transaction mode.
func (c call) extended(defaultMode func() pgx.QueryExecMode, exec bool) call {
	mode := c.mode
	if !c.explicit {
		mode = defaultMode()
	}
	if mode != pgx.QueryExecModeSimpleProtocol && !(exec && len(c.params) == 0) {
		return c
	}
	options := []any{pgx.QueryExecModeExec}
	for _, o := range c.options {
		if _, isMode := o.(pgx.QueryExecMode); !isMode {
			options = append(options, o)
		}
	}
	c.options, c.mode, c.explicit = options, pgx.QueryExecModeExec, true
	return c
}

// maxRewrites bounds how many times a rewriter may return another one.
const maxRewrites = 8

var errRewritesLoop = fmt.Errorf("the query's QueryRewriter returned arguments led by another QueryRewriter more than %d times: refused", maxRewrites)

// resolve applies the QueryRewriter among the leading options of args to
// sql, as pgx does, until none is left. In a batch, pgx reads no option
// but a rewriter. The rewriter gets no connection (nil), where pgx would
// give it the bare one, which the guard hands out to nobody: pgx's own
// (NamedArgs, StrictNamedArgs) do not use it.
func resolve(ctx context.Context, sql string, args []any, batch bool) (call, error) {
	for range maxRewrites {
		var rewriter pgx.QueryRewriter
		c := call{sql: sql}
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
			c.options = append(c.options, args[i])
		}
		params := args[i:]
		if rewriter == nil {
			c.params = params
			return c, nil
		}
		rewritten, rewrittenArgs, err := rewriter.RewriteQuery(ctx, nil, sql, params)
		if err != nil {
			return call{}, fmt.Errorf("rewrite query failed: %w", err)
		}
		sql, args = rewritten, append(c.options, rewrittenArgs...)
	}
	return call{}, errRewritesLoop
}
