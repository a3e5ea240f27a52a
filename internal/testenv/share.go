package testenv

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// RequireShareGroups skips the test unless brokers offer share groups
// (KIP-932): ShareFetch (API key 78) among their ApiVersions and the
// share.version feature finalized at 1 or above. The key alone is not
// enough: Kafka 4.1 lists it with share.version supported and not
// finalized, its share groups an early access left off (it also refuses
// the group config share.delivery.count.limit, new in 4.2); 3.9 does not
// list it. 4.2 and later finalize share.version=1 when their storage is
// formatted. The answer is asked once per broker list.
func RequireShareGroups(tb testing.TB, brokers []string) {
	tb.Helper()
	if err := shareGroupsOffer(apiVersions(tb, brokers)); err != nil {
		tb.Skipf("share groups not tested on %s: %v", strings.Join(brokers, ","), err)
	}
}

func shareGroupsOffer(resp *kmsg.ApiVersionsResponse) error {
	if !slices.ContainsFunc(resp.ApiKeys, func(k kmsg.ApiVersionsResponseApiKey) bool { return k.ApiKey == kmsg.ShareFetch.Int16() }) {
		return errors.New("the broker offers no ShareFetch (API key 78): share groups need Kafka 4.2 or later")
	}
	if !slices.ContainsFunc(resp.FinalizedFeatures, func(f kmsg.ApiVersionsResponseFinalizedFeature) bool {
		return f.Name == "share.version" && f.MaxVersionLevel >= 1
	}) {
		return errors.New("the broker's share.version feature is not finalized (an early access, as in Kafka 4.1): share groups need Kafka 4.2 or later")
	}
	return nil
}
