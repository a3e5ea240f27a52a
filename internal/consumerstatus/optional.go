package consumerstatus

import "strconv"

// Optional shows a number that is -1 when unknown as "-".
func Optional(v int64) string {
	if v < 0 {
		return "-"
	}
	return strconv.FormatInt(v, 10)
}
