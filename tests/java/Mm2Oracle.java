/*
 * Drives MirrorMaker 2's own classes so that mirrorflow's tests can compare against them.
 *
 * It lives in MirrorMaker 2's package because the record encoders (recordKey/recordValue),
 * OffsetSyncWriter and OffsetSyncStore are package-private; compile it with javac onto the
 * classpath next to the connect-mirror jars (the single-file launcher would load it in another
 * class loader, hence another runtime package).
 *
 * Protocol: one command per line on stdin, one answer per line on stdout. Strings travel as hex
 * of their UTF-8 bytes, records as hex. A command that throws answers "error <Class>: <message>".
 *
 *   heartbeat-encode SOURCE TARGET TIMESTAMP                  -> KEY VALUE
 *   heartbeat-decode KEY VALUE                                -> SOURCE TARGET TIMESTAMP
 *   checkpoint-encode GROUP TOPIC PARTITION UP DOWN METADATA  -> KEY VALUE
 *   checkpoint-decode KEY VALUE                               -> GROUP TOPIC PARTITION UP DOWN METADATA
 *   offset-sync-encode TOPIC PARTITION UP DOWN                -> KEY VALUE
 *   offset-sync-decode KEY VALUE                              -> TOPIC PARTITION UP DOWN
 *   writer MAX_OFFSET_LAG OPS      OPS: ';'-separated "copy,PARTITION,UP:DOWN,UP:DOWN..." or
 *                                  "promote"; answers, per op, the syncs sent (',' separated
 *                                  PARTITION:UP:DOWN), as if every pending sync were sent at once
 *   store MUST_READ_TO_END OPS     OPS: ';'-separated "sync,PARTITION,UP,DOWN", "start" or
 *                                  "translate,PARTITION,UP"; answers, per op, the partition's
 *                                  64 syncs ('/' separated UP:DOWN), "started", or the
 *                                  translation ("none" when empty)
 *   remote-translate PROPS ALIAS GROUP TIMEOUT_MS
 *                                  RemoteClusterUtils.translateOffsets(props, alias, group,
 *                                  timeout) against a real cluster; answers words
 *                                  TOPIC:PARTITION:OFFSET:METADATA sorted by topic and
 *                                  partition, or "none" when empty
 *   remote-translate-pattern PROPS ALIAS GROUP_PATTERN TIMEOUT_MS
 *                                  the batch form translateOffsets(props, alias, Pattern,
 *                                  timeout); words GROUP:TOPIC:PARTITION:OFFSET:METADATA sorted
 *                                  by group, topic and partition, or "none" when empty
 *
 *   worker-config PROPS SOURCE TARGET NAME
 *                                  MirrorMakerConfig(PROPS).workerConfig(SOURCE->TARGET)'s
 *                                  value of NAME (hex), or "none"; PROPS here is a whole
 *                                  mm2.properties
 *
 * PROPS is the client properties (bootstrap.servers, security settings) as ','-separated
 * KEY=VALUE pairs, each side hex. TIMEOUT_MS is a plain number; GROUP_PATTERN is a Java regex.
 * Kafka's clients log through log4j, so System.out is pointed at stderr: only answers reach
 * the real stdout.
 *
 * Topic "t" is used for the writer and the store.
 */
package org.apache.kafka.connect.mirror;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;

import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.StringJoiner;
import java.util.concurrent.Semaphore;
import java.util.regex.Pattern;

public final class Mm2Oracle {
    private static final HexFormat HEX = HexFormat.of();

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        String line;
        while ((line = in.readLine()) != null) {
            String answer;
            try {
                answer = answer(line.split(" ", -1));
            } catch (Throwable e) {
                answer = "error " + e.getClass().getSimpleName() + ": " + String.valueOf(e.getMessage()).replace('\n', ' ');
            }
            out.println(answer);
        }
    }

    private static String answer(String[] a) throws Exception {
        switch (a[0]) {
            case "heartbeat-encode": {
                Heartbeat h = new Heartbeat(text(a[1]), text(a[2]), Long.parseLong(a[3]));
                return HEX.formatHex(h.recordKey()) + " " + HEX.formatHex(h.recordValue());
            }
            case "heartbeat-decode": {
                Heartbeat h = Heartbeat.deserializeRecord(record(a[1], a[2]));
                return hex(h.sourceClusterAlias()) + " " + hex(h.targetClusterAlias()) + " " + h.timestamp();
            }
            case "checkpoint-encode": {
                Checkpoint c = new Checkpoint(text(a[1]), new TopicPartition(text(a[2]), Integer.parseInt(a[3])),
                        Long.parseLong(a[4]), Long.parseLong(a[5]), text(a[6]));
                return HEX.formatHex(c.recordKey()) + " " + HEX.formatHex(c.recordValue());
            }
            case "checkpoint-decode": {
                Checkpoint c = Checkpoint.deserializeRecord(record(a[1], a[2]));
                return hex(c.consumerGroupId()) + " " + hex(c.topicPartition().topic()) + " "
                        + c.topicPartition().partition() + " " + c.upstreamOffset() + " "
                        + c.downstreamOffset() + " " + hex(c.metadata());
            }
            case "offset-sync-encode": {
                OffsetSync s = new OffsetSync(new TopicPartition(text(a[1]), Integer.parseInt(a[2])),
                        Long.parseLong(a[3]), Long.parseLong(a[4]));
                return HEX.formatHex(s.recordKey()) + " " + HEX.formatHex(s.recordValue());
            }
            case "offset-sync-decode": {
                OffsetSync s = OffsetSync.deserializeRecord(record(a[1], a[2]));
                return hex(s.topicPartition().topic()) + " " + s.topicPartition().partition() + " "
                        + s.upstreamOffset() + " " + s.downstreamOffset();
            }
            case "writer":
                return writer(Long.parseLong(a[1]), a[2]);
            case "store":
                return store(Boolean.parseBoolean(a[1]), a[2]);
            case "remote-translate": {
                Map<TopicPartition, OffsetAndMetadata> offsets = RemoteClusterUtils.translateOffsets(
                        props(a[1]), text(a[2]), text(a[3]), Duration.ofMillis(Long.parseLong(a[4])));
                List<String> words = new ArrayList<>();
                addOffsets("", offsets, words);
                return words.isEmpty() ? "none" : String.join(" ", words);
            }
            case "remote-translate-pattern": {
                Map<String, Map<TopicPartition, OffsetAndMetadata>> byGroup = RemoteClusterUtils.translateOffsets(
                        props(a[1]), text(a[2]), Pattern.compile(text(a[3])),
                        Duration.ofMillis(Long.parseLong(a[4])));
                List<String> words = new ArrayList<>();
                byGroup.keySet().stream().sorted().forEach(g -> addOffsets(hex(g) + ":", byGroup.get(g), words));
                return words.isEmpty() ? "none" : String.join(" ", words);
            }
            case "worker-config": {
                Map<String, String> mm2 = new HashMap<>();
                props(a[1]).forEach((k, v) -> mm2.put(k, String.valueOf(v)));
                Map<String, String> worker = new MirrorMakerConfig(mm2)
                        .workerConfig(new SourceAndTarget(text(a[2]), text(a[3])));
                String value = worker.get(text(a[4]));
                return value == null ? "none" : hex(value);
            }
            default:
                throw new IllegalArgumentException("unknown command " + a[0]);
        }
    }

    private static String writer(long maxOffsetLag, String ops) {
        // No producer: pending syncs are taken out of the writer instead of being sent.
        OffsetSyncWriter writer = new OffsetSyncWriter(null, "mm2-offset-syncs.target.internal",
                new Semaphore(10), maxOffsetLag);
        StringJoiner answers = new StringJoiner(";");
        for (String op : ops.split(";")) {
            String[] f = op.split(",");
            StringJoiner sent = new StringJoiner(",");
            if (f[0].equals("promote")) {
                writer.promoteDelayedOffsetSyncs();
                takePending(writer.getPendingOffsetSyncs(), sent);
            } else {
                TopicPartition tp = new TopicPartition("t", Integer.parseInt(f[1]));
                for (int i = 2; i < f.length; i++) {
                    String[] offsets = f[i].split(":");
                    writer.maybeQueueOffsetSyncs(tp, Long.parseLong(offsets[0]), Long.parseLong(offsets[1]));
                    takePending(writer.getPendingOffsetSyncs(), sent);
                }
            }
            answers.add(sent.toString());
        }
        return answers.toString();
    }

    private static void takePending(Map<TopicPartition, OffsetSync> pending, StringJoiner sent) {
        for (OffsetSync s : pending.values()) {
            sent.add(s.topicPartition().partition() + ":" + s.upstreamOffset() + ":" + s.downstreamOffset());
        }
        pending.clear();
    }

    /** OffsetSyncStore without its Kafka-backed log; records arrive through handleRecord. */
    private static final class Store extends OffsetSyncStore {
        Store(boolean initializationMustReadToEnd) {
            super();
            this.initializationMustReadToEnd = initializationMustReadToEnd;
        }

        @Override
        void backingStoreStart() {
        }
    }

    private static String store(boolean initializationMustReadToEnd, String ops) {
        Store store = new Store(initializationMustReadToEnd);
        StringJoiner answers = new StringJoiner(";");
        for (String op : ops.split(";")) {
            String[] f = op.split(",");
            switch (f[0]) {
                case "sync": {
                    TopicPartition tp = new TopicPartition("t", Integer.parseInt(f[1]));
                    OffsetSync sync = new OffsetSync(tp, Long.parseLong(f[2]), Long.parseLong(f[3]));
                    store.handleRecord(new ConsumerRecord<>("mm2-offset-syncs.target.internal", 0, 0L,
                            sync.recordKey(), sync.recordValue()));
                    StringJoiner syncs = new StringJoiner("/");
                    for (int i = 0; i < OffsetSyncStore.SYNCS_PER_PARTITION; i++) {
                        OffsetSync s = store.syncFor(tp, i);
                        syncs.add(s.upstreamOffset() + ":" + s.downstreamOffset());
                    }
                    answers.add(syncs.toString());
                    break;
                }
                case "start":
                    store.start(initializationMustReadToEnd);
                    answers.add("started");
                    break;
                case "translate": {
                    TopicPartition tp = new TopicPartition("t", Integer.parseInt(f[1]));
                    OptionalLong translated = store.translateDownstream("group", tp, Long.parseLong(f[2]));
                    answers.add(translated.isPresent() ? String.valueOf(translated.getAsLong()) : "none");
                    break;
                }
                default:
                    throw new IllegalArgumentException("unknown store op " + f[0]);
            }
        }
        return answers.toString();
    }

    /** PROPS: ','-separated KEY=VALUE pairs, each side hex of its UTF-8 bytes. */
    private static Map<String, Object> props(String pairs) {
        Map<String, Object> props = new HashMap<>();
        for (String pair : pairs.split(",")) {
            if (!pair.isEmpty()) {
                String[] kv = pair.split("=", 2);
                props.put(text(kv[0]), text(kv[1]));
            }
        }
        return props;
    }

    private static void addOffsets(String prefix, Map<TopicPartition, OffsetAndMetadata> offsets, List<String> words) {
        offsets.entrySet().stream()
                .sorted(Map.Entry.comparingByKey(
                        Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition)))
                .forEach(e -> words.add(prefix + hex(e.getKey().topic()) + ":" + e.getKey().partition() + ":"
                        + e.getValue().offset() + ":" + hex(e.getValue().metadata())));
    }

    private static ConsumerRecord<byte[], byte[]> record(String key, String value) {
        return new ConsumerRecord<>("topic", 0, 0L, HEX.parseHex(key), HEX.parseHex(value));
    }

    private static String text(String hex) {
        return new String(HEX.parseHex(hex), StandardCharsets.UTF_8);
    }

    private static String hex(String text) {
        return HEX.formatHex(text.getBytes(StandardCharsets.UTF_8));
    }
}
