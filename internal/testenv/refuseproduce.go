package testenv

import (
	"bytes"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// RefuseProduce makes the in-process broker answer code to produce
// requests whose records contain marker: once, or every time (always).
// The records are looked at decompressed: a compressed batch (franz-go
// sends snappy) may encode the marker as a reference back to earlier
// bytes, and would slip through a search of the raw bytes.
func (k *Kafka) RefuseProduce(marker string, code int16, always bool) {
	k.Fake.ControlKey(kmsg.Produce.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if always {
			k.Fake.KeepControl()
		}
		req := kreq.(*kmsg.ProduceRequest)
		hit := false
		for _, tp := range req.Topics {
			for _, p := range tp.Partitions {
				hit = hit || bytes.Contains(recordBytes(p.Records), []byte(marker))
			}
		}
		if !hit {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		resp.SetVersion(req.GetVersion())
		for _, tp := range req.Topics {
			rt := kmsg.NewProduceResponseTopic()
			rt.Topic, rt.TopicID = tp.Topic, tp.TopicID
			for _, p := range tp.Partitions {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition = p.Partition
				rp.ErrorCode = code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})
}

// recordBytes is a produce request's record batch with its records
// decompressed, or raw as it came when it is not one batch.
func recordBytes(raw []byte) []byte {
	var b kmsg.RecordBatch
	if err := b.ReadFrom(raw); err != nil {
		return raw
	}
	recs, err := kgo.DefaultDecompressor().Decompress(b.Records, kgo.CompressionCodecType(b.Attributes&0x07))
	if err != nil {
		return raw
	}
	return recs
}
