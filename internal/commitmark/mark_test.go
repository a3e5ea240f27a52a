package commitmark_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/commitmark"
)

func TestMark(t *testing.T) {
	t.Run("reads back what it writes, names with spaces included", func(t *testing.T) {
		for _, m := range []commitmark.Mark{
			{Store: "0b6a5f1e-52f4-4a3c-9d3e-1f2a3b4c5d6e", Consumer: "ledger", First: 0},
			{Store: "0b6a5f1e-52f4-4a3c-9d3e-1f2a3b4c5d6e", Consumer: "a name with spaces first=3", First: 1234567890123},
			{Store: "x", Consumer: "ledger", First: -1},
		} {
			got, ok := commitmark.Parse(m.String())
			require.True(t, ok, m.String())
			require.Equal(t, m, got)
		}
	})
	t.Run("anything else is no mark", func(t *testing.T) {
		for _, s := range []string{
			"",
			"member-1-4f2c", // franz-go's default metadata: the member id
			"kafkaonce/2 store=x first=0 consumer=ledger",
			"kafkaonce/1 store= first=0 consumer=ledger",
			"kafkaonce/1 store=x first=-2 consumer=ledger",
			"kafkaonce/1 store=x first=ten consumer=ledger",
			"kafkaonce/1 store=x first=0 consumer=",
			"kafkaonce/1 store=x consumer=ledger",
		} {
			_, ok := commitmark.Parse(s)
			require.False(t, ok, "%q", s)
		}
	})
}
