#!/usr/bin/env bash
# Runs a single-node Apache Kafka broker (KRaft mode) from the official
# broker jars, fetched from Maven Central with mvn and cached.
#
#   scripts/kafka-broker.sh start VERSION PORT DIR   # prints 127.0.0.1:PORT when ready
#   scripts/kafka-broker.sh stop DIR
#
# VERSION must accept kafka-go's consumer group (JoinGroup v1): 3.9.x, or
# 4.0.1 and later (4.0.0 rejects it). DIR holds the broker's data, log and
# pid. The jars are cached in $KAFKAONCE_CACHE (default ~/.cache/kafkaonce).
# Exit code 3 means the jars could not be fetched (one line on stderr says
# why); callers may carry on without a real broker.
set -euo pipefail
# Any failure not handled below still says where and what failed.
trap 'echo "kafka-broker: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

# consumer_protocol VERSION succeeds for a Kafka whose consumer group
# protocol (KIP-848) is generally available (4.0 and later).
consumer_protocol() {
	local major
	IFS=. read -r major _ <<<"$1"
	[ "$major" -ge 4 ]
}

# share_groups VERSION succeeds for a Kafka whose share groups are
# generally available (4.2 and later).
share_groups() {
	local major minor
	IFS=. read -r major minor _ <<<"$1"
	[ "$major" -gt 4 ] || { [ "$major" -eq 4 ] && [ "$minor" -ge 2 ]; }
}

cmd=${1:-}
case "$cmd" in
start)
	version=${2:?version}; port=${3:?port}; dir=${4:?dir}
	cache=${KAFKAONCE_CACHE:-$HOME/.cache/kafkaonce}/kafka-$version
	if [ ! -f "$cache/.complete" ]; then
		mkdir -p "$cache"
		cat > "$cache/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kafkaonce.ci</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$version</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
POM
		if ! command -v mvn >/dev/null 2>&1; then
			echo "kafka-broker: mvn is not installed, so Apache Kafka $version cannot be fetched" >&2
			exit 3
		fi
		if ! mvn -q -B -f "$cache/pom.xml" dependency:copy-dependencies -DoutputDirectory="$cache/libs" >"$cache/mvn.log" 2>&1; then
			echo "kafka-broker: could not fetch Apache Kafka $version jars with mvn ($(grep -m1 -E 'ERROR' "$cache/mvn.log" | cut -c1-200))" >&2
			exit 3
		fi
		touch "$cache/.complete"
	fi
	# Always a fresh broker: stale data from an earlier run would confuse the tests.
	rm -rf "$dir/data"
	mkdir -p "$dir/data"
	for p in "$port" "$((port + 1))"; do
		if (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "kafka-broker: port $p is already in use; pick another (below 32768 stays clear of client ports)" >&2
			exit 1
		fi
	done
	cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$((port + 1))
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$((port + 1))
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
PROPS
	# Share groups (KIP-932), generally available from 4.2: the format
	# below finalizes share.version=1 on its own, so only the share
	# coordinator's state topic needs a replication factor one broker can
	# give (its default of 3 leaves every share group uninitialized), and
	# the bounds on a group's settings are lowered so that tests may set a
	# lock of a second or two, and a short session, per group. Older
	# brokers get none of this: their share groups are not enabled.
	if share_groups "$version"; then
		cat >> "$dir/server.properties" <<PROPS
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.share.min.record.lock.duration.ms=1000
group.share.min.heartbeat.interval.ms=500
group.share.heartbeat.interval.ms=500
group.share.min.session.timeout.ms=6000
group.share.session.timeout.ms=10000
PROPS
	fi
	# The consumer group protocol (KIP-848), generally available from 4.0:
	# the bounds on a group's session and heartbeat are lowered so that
	# tests may give their groups a short session, as the classic
	# protocol's members do for themselves.
	if consumer_protocol "$version"; then
		cat >> "$dir/server.properties" <<PROPS
group.consumer.min.session.timeout.ms=3000
group.consumer.min.heartbeat.interval.ms=250
PROPS
	fi
	cat > "$dir/log4j.properties" <<'LOG'
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=${kafka.logs.dir}/broker.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
LOG
	cp="$cache/libs/*"
	jvm=(-Xmx768m -Dlog4j.configuration="file:$dir/log4j.properties" -Dkafka.logs.dir="$dir")
	if ! command -v java >/dev/null 2>&1; then
		echo "kafka-broker: java is not installed; Apache Kafka $version needs Java 17 or later" >&2
		exit 1
	fi
	cluster_id=$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
	if ! java "${jvm[@]}" -cp "$cp" kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" >"$dir/format.log" 2>&1; then
		echo "kafka-broker: formatting the storage of Apache Kafka $version failed; $dir/format.log says:" >&2
		tail -20 "$dir/format.log" >&2
		exit 1
	fi
	nohup java "${jvm[@]}" -cp "$cp" kafka.Kafka "$dir/server.properties" >"$dir/stdout.log" 2>&1 &
	echo $! >"$dir/pid"
	for _ in $(seq 1 120); do
		if (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "127.0.0.1:$port"
			exit 0
		fi
		if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
			echo "kafka-broker: Apache Kafka $version exited at start-up; see $dir/stdout.log" >&2
			tail -20 "$dir/stdout.log" >&2 || true
			exit 1
		fi
		sleep 0.5
	done
	echo "kafka-broker: Apache Kafka $version did not listen on port $port within 60s" >&2
	exit 1
	;;
stop)
	dir=${2:?dir}
	if [ -f "$dir/pid" ]; then
		pid=$(cat "$dir/pid")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
		kill -9 "$pid" 2>/dev/null || true
		rm -f "$dir/pid"
	fi
	;;
*)
	echo "usage: $0 start VERSION PORT DIR | stop DIR" >&2
	exit 2
	;;
esac
