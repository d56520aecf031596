package org.mirrorflow.kafka;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Queue;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetOutOfRangeException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthenticationException;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.spark.SparkExecutorInfo;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.Function;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * mirrorflow's at-least-once copy: the mirror job's driver plans each batch (which offsets of
 * which source partitions, from the flow's positions to the partitions' ends), and the executors
 * copy those offset ranges with Kafka's own Java clients, record for record, without turning them
 * into Spark rows. Only Spark's public RDD API is used.
 *
 * <p>Each copy keeps its source record's partition, key, value, headers and timestamp. The
 * acknowledgement of each copy gives its exact downstream offset to the {@link OffsetSyncWriter}.
 * A task ends when every copy of its range is acknowledged; a failed copy fails the task, so
 * the driver never records a position whose copies are not all on the target.
 *
 * <p>The settings are one flat map of strings: {@code consumer.*} and {@code producer.*} (Java
 * client properties of the source consumer and the target producer), {@code topic.<source>}
 * (the remote name of each topic to copy), {@code limit.<remote>} (its {@code
 * max.message.bytes}), {@code record.overhead}, {@code source}, {@code target} (the clusters'
 * aliases), {@code error.prefix} (what starts the messages the mirror job turns into one line
 * for its user), {@code source.principal}, {@code target.principal}, {@code poll.timeout.ms}, and,
 * when offset syncs are written, {@code syncs.topic}, {@code syncs.lag.max}, {@code
 * syncs.interval.ms}, {@code syncs.producer.*}, {@code syncs} (the cluster they go to) and
 * {@code syncs.principal}; {@code batch} names the batch, so that {@link #cancel} can end it;
 * {@code transform} (and {@code transform.headers}: whether it changes headers) is the flow's
 * {@link RecordTransform}, when it has one: a record it drops is not copied, its offset is a gap.
 *
 * <p>A batch is cancelled (its flow paused or held, e.g. by a failover) with {@link #cancel}: each
 * of its ranges stops reading at its next poll (at most half a second later, whether the source
 * answers or not), waits for the acknowledgement of every copy it sent, and returns what it
 * copied, with the offset its range reached ({@link Copied#next}), so the driver moves the
 * flow's positions to exactly the last acknowledged copy. This reaches the tasks that run in the
 * driver's JVM: {@link #copyLocal}, and every task with a {@code local[*]} master. Tasks in other
 * JVMs (a cluster master) only see Spark's own job cancellation.
 */
public final class MirrorCopier {

  private static final Logger LOG = LoggerFactory.getLogger(MirrorCopier.class);

  /** Threads of {@link #copyLocal}'s ranges past the first (idle ones end after a minute). */
  private static final ExecutorService LOCAL_TASKS =
      Executors.newCachedThreadPool(
          r -> {
            Thread thread = new Thread(r, "mirrorflow-local-copy");
            thread.setDaemon(true);
            return thread;
          });

  /** The batches cancelled while their tasks may still run (see {@link #cancel}). */
  private static final Set<String> CANCELLED = ConcurrentHashMap.newKeySet();

  /**
   * The batches one of whose ranges got no record from the source for {@code poll.timeout.ms}:
   * the others of the batch (same source) end at their next poll instead of waiting as long.
   */
  private static final Set<String> STALLED = ConcurrentHashMap.newKeySet();

  /** A stream's consumers' fetch.max.wait.ms, unless the flow's consumer sets it. */
  static final String STREAM_FETCH_MAX_WAIT_MS = "5000";

  /**
   * How often (ms) a stream reads its paced partitions ({@code paced.<topic>}: the heartbeat
   * topics of a flow): what arrived since, in one fetch.
   */
  static final long STREAM_PACED_MS = 1000;

  /**
   * How often (ms) a stream reads its paced partitions while it knows records past its
   * position (a backlog of heartbeats) or does not know their end yet (its consumer connects).
   * Its consumer reads from the network only while it is polled, without waiting: polled once
   * a beat, a fetch's answer came in one socket buffer a beat (a 1-MiB answer: ~10 s), and a new
   * consumer took a step of its start a beat (connection, authentication, metadata: a
   * standalone consumer polled so had its first records after 16 s).
   */
  static final long STREAM_PACED_BEHIND_MS = 5;

  /**
   * For how long (ms) a stream reads its paced partitions every {@link #STREAM_PACED_BEHIND_MS}
   * while an end stays unknown: long enough for a consumer to start, and to reach a leader
   * elected meanwhile; past it (no fetch of that partition answered, its leader gone), once a
   * beat again, until an end is known.
   */
  static final long STREAM_PACED_UNKNOWN_MS = 10_000;

  /**
   * The most (bytes) one fetch of a stream's paced consumer brings, in all and per partition:
   * an answer its socket's buffer holds whole (the consumer's receive.buffer.bytes, 64 KiB), so
   * that one poll reads it, and with it the partitions' ends, which tell that more is waiting.
   * Some 700 heartbeats; a backlog comes in answers of this size every few ms.
   */
  static final String STREAM_PACED_FETCH_BYTES = "32768";

  /**
   * How long a stream's end waits for its copies' acknowledgements unless {@code
   * stream.end.grace.ms} says (MirrorMaker 2's {@code task.shutdown.graceful.timeout.ms}).
   */
  static final String STREAM_END_GRACE_MS = "5000";

  /**
   * What a stream's end waits for its task beyond the grace: its last poll (0.5 s) and its
   * consumer's close (at most 5 s).
   */
  static final long STREAM_END_SLACK_MS = 6000;

  /** A stream's allowance without end (see {@link #ALLOWED}). */
  static final long OPEN = Long.MAX_VALUE;

  /** The running streams, by batch. */
  private static final Map<String, Stream> STREAMS = new ConcurrentHashMap<>();

  /**
   * Until when (epoch ms) each running stream may read and copy: the driver extends it while its
   * flow's lease is fresh ({@link #allow}). A stream whose allowance ran out (its process was
   * frozen past it, or the driver stopped extending it) copies nothing more, not even the rest
   * of what it polled, until the driver extends it again or ends the stream.
   */
  private static final Map<String, AtomicLong> ALLOWED = new ConcurrentHashMap<>();

  private MirrorCopier() {}

  /**
   * The lines of {@code joined} ({@code \n}-separated; none when empty) as a list. A driver's
   * Python passes a list of ranges in one call: py4j sends a Python list item by item, a round
   * trip each.
   */
  public static List<String> lines(String joined) {
    List<String> lines = new ArrayList<>();
    if (!joined.isEmpty()) {
      for (String line : joined.split("\n", -1)) {
        lines.add(line);
      }
    }
    return lines;
  }

  /**
   * Settings encoded as {@code key NUL value NUL key NUL value ...} as a map, for the same
   * reason as {@link #lines}: py4j sends a Python dict entry by entry.
   */
  public static Map<String, String> settings(String encoded) {
    Map<String, String> settings = new HashMap<>();
    if (!encoded.isEmpty()) {
      String[] parts = encoded.split("\u0000", -1);
      if (parts.length % 2 != 0) {
        throw new IllegalArgumentException("settings: a key without its value");
      }
      for (int i = 0; i < parts.length; i += 2) {
        settings.put(parts[i], parts[i + 1]);
      }
    }
    return settings;
  }

  /**
   * Starts copying {@code ranges} ({@code topic\tpartition\tfrom}) continuously in this JVM
   * (the driver's): one task on its own thread, with one consumer for every range (as a
   * MirrorMaker 2 task reads all its partitions with one consumer), copying each record as
   * {@link #copy}'s tasks do, with no end: it reads, copies and writes offset syncs as records
   * arrive, until {@link #endStream}. Its batch is {@code settings}' {@code batch}. The driver takes what is
   * acknowledged with {@link #harvest}, as often as it commits positions. Its producer takes
   * {@code stream.producer.*} settings in place of {@code producer.*} ones (a shorter linger,
   * smaller batches), and it
   * copies until {@code stream.allowed.until.ms} unless {@link #allow}ed longer. Its end waits
   * at most {@code stream.end.grace.ms} for its copies' acknowledgements ({@link
   * #STREAM_END_GRACE_MS} unless set).
   */
  public static void stream(List<String> ranges, Map<String, String> settings) {
    String batch = settings.get("batch");
    HashMap<String, String> own = new HashMap<>(settings);
    for (Map.Entry<String, String> entry : settings.entrySet()) {
      if (entry.getKey().startsWith("stream.producer.")) { // e.g. copies go out as they arrive
        own.put(entry.getKey().substring("stream.".length()), entry.getValue());
      }
    }
    // An idle partition's consumer keeps one fetch waiting on the broker, answered as soon as a
    // record arrives (fetch.min.bytes 1): a long wait costs no latency, and an idle stream then
    // asks each partition every few seconds instead of twice a second.
    own.putIfAbsent("consumer.fetch.max.wait.ms", STREAM_FETCH_MAX_WAIT_MS);
    CopyRange task = new CopyRange(own);
    Stream stream =
        new Stream(
            settings.get("source") + "->" + settings.get("target"),
            Long.parseLong(settings.getOrDefault("stream.end.grace.ms", STREAM_END_GRACE_MS)));
    ALLOWED.put(
        batch,
        new AtomicLong(Long.parseLong(settings.getOrDefault("stream.allowed.until.ms", "" + OPEN))));
    stream.add(ranges, Map.of());
    stream.tasks.add(LOCAL_TASKS.submit(() -> task.stream(stream)));
    STREAMS.put(batch, stream);
  }

  /**
   * Adds {@code ranges} ({@code topic\tpartition\tfrom}: partitions new to the flow, its
   * topics' new partitions) to the running stream of {@code batch}, after its others in
   * {@link #harvest}'s results. Its task takes them at its next poll, with {@code settings}'
   * names and size limits of remote topics ({@code topic.*}, {@code limit.*}): the stream goes
   * on copying its other partitions meanwhile, as a MirrorMaker 2 task's consumer is given new
   * partitions without stopping.
   */
  public static void extend(String batch, List<String> ranges, Map<String, String> settings) {
    Stream stream = STREAMS.get(batch);
    if (stream == null) {
      throw new IllegalStateException("no stream " + batch);
    }
    Map<String, String> names = new HashMap<>();
    for (Map.Entry<String, String> entry : settings.entrySet()) {
      if (entry.getKey().startsWith("topic.")
          || entry.getKey().startsWith("limit.")
          || entry.getKey().startsWith("paced.")) {
        names.put(entry.getKey(), entry.getValue());
      }
    }
    stream.add(ranges, names);
  }

  /**
   * What the stream of {@code batch} copied since the last harvest, encoded as {@link #copy}'s
   * results: per range the records, bytes, ages and latencies acknowledged, the offset below
   * which every copy is acknowledged ({@link Copied#next}: the position to write), when it was
   * last caught up and the end its consumer saw, and the runs of copies below that offset;
   * in its head, how many batches its producer has split so far ({@link Stream#batchesSplit}).
   * Throws the error of a range that failed (then call {@link #endStream}).
   */
  public static byte[] harvest(String batch) throws Exception {
    Stream stream = STREAMS.get(batch);
    if (stream == null) {
      throw new IllegalStateException("no stream " + batch);
    }
    for (Future<?> task : stream.tasks) {
      if (task.isDone()) {
        try {
          task.get();
        } catch (ExecutionException e) {
          throw e.getCause() instanceof Exception cause ? cause : e;
        }
      }
    }
    return Copied.encode(stream.drain(), stream.batchesSplit());
  }

  /**
   * Ends the stream of {@code batch}: each range stops reading at its next poll, waits for the
   * acknowledgement of every copy it sent (at most {@code stream.end.grace.ms}: then the
   * positions stay before the copies not acknowledged), and ends. Returns what was acknowledged since the
   * last harvest (as {@link #harvest}); then {@link #streamError} tells whether a range failed.
   */
  public static byte[] endStream(String batch) throws InterruptedException {
    Stream stream = STREAMS.get(batch);
    if (stream == null) {
      return Copied.encode(List.of());
    }
    stream.ended = true;
    cancel(batch);
    // The task's own end: its poll, its consumer's close (bounded), then the grace for its
    // copies' acknowledgements. A task still not ended (blocked sending: its producer waits
    // for the metadata of a target that does not answer, up to max.block.ms) is left to end
    // alone: it sends nothing more once unblocked, and what it sent stays past the positions.
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(stream.graceMs + STREAM_END_SLACK_MS);
    for (Future<?> task : stream.tasks) {
      try {
        task.get(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
      } catch (ExecutionException e) {
        stream.error.compareAndSet(null, e.getCause());
      } catch (java.util.concurrent.TimeoutException e) {
        LOG.warn(
            "{}: the stream ended with its task still sending (copies not acknowledged) after "
                + "task.shutdown.graceful.timeout.ms={} (and {} ms to stop reading): it ends "
                + "alone, and the positions stay before its copies, so the flow's next start "
                + "copies them again",
            stream.flow, stream.graceMs, STREAM_END_SLACK_MS);
      }
    }
    return Copied.encode(stream.drain(), stream.batchesSplit());
  }

  /**
   * After {@link #endStream}: the error of the first range of {@code batch} that failed (its
   * class and message, then its causes', one per line), or null; the stream is forgotten.
   */
  public static String streamError(String batch) {
    Stream stream = STREAMS.remove(batch);
    forget(batch);
    if (stream == null || stream.error.get() == null) {
      return null;
    }
    StringBuilder text = new StringBuilder();
    for (Throwable cause = stream.error.get(); cause != null; cause = cause.getCause()) {
      text.append(cause.getClass().getName()).append(": ").append(cause.getMessage()).append('\n');
      if (cause.getCause() == cause) {
        break;
      }
    }
    return text.toString();
  }

  /**
   * Lets the stream of {@code batch} read and copy until {@code untilMs} (epoch ms); see
   * {@link #ALLOWED}.
   */
  public static void allow(String batch, long untilMs) {
    AtomicLong allowed = ALLOWED.get(batch);
    if (allowed != null) {
      allowed.set(untilMs);
    }
  }

  /**
   * A stream's partitions: where each was last drained from, its progress and its task; and the
   * partitions added that its task has not taken yet.
   */
  private static final class Stream {
    final List<Long> from = new ArrayList<>();
    final List<Copied> progress = new ArrayList<>();
    final List<Future<?>> tasks = new ArrayList<>();
    final AtomicReference<Throwable> error = new AtomicReference<>();
    final Queue<Added> added = new ConcurrentLinkedQueue<>();
    /** Ended ({@link #endStream}): its task sends nothing more, even one left to end alone. */
    volatile boolean ended;
    /** How long its end waits for its copies' acknowledgements ({@code stream.end.grace.ms}). */
    final long graceMs;
    /** Its flow ({@code source->target}), for its log lines. */
    final String flow;
    /** Its task's producer, once it has one (see {@link #batchesSplit}). */
    private volatile KafkaProducer<byte[], byte[]> producer;
    /** The producer's {@code batch-split-total} when the stream took it (producers are pooled). */
    private volatile long splitBefore;

    void producer(KafkaProducer<byte[], byte[]> producer) {
      splitBefore = batchSplitTotal(producer);
      this.producer = producer;
    }

    Stream(String flow, long graceMs) {
      this.flow = flow;
      this.graceMs = graceMs;
    }

    /** Partitions and where they start, and the settings naming their remote topics. */
    record Added(List<TopicPartition> partitions, List<Copied> progress, Map<String, String> names) {}

    synchronized void add(List<String> ranges, Map<String, String> names) {
      List<TopicPartition> partitions = new ArrayList<>();
      List<Copied> copied = new ArrayList<>();
      for (String range : ranges) {
        String[] fields = range.split("\t");
        long start = Long.parseLong(fields[2]);
        Copied progress = new Copied();
        progress.sentNext = start;
        progress.next = start;
        partitions.add(new TopicPartition(fields[0], Integer.parseInt(fields[1])));
        copied.add(progress);
        this.from.add(start);
        this.progress.add(progress);
      }
      added.add(new Added(partitions, copied, names));
    }

    /**
     * How many batches its producer has split since it started ({@code batch-split-total}):
     * the broker refused them as too large for their topic. Kafka's producer splits such a
     * batch into batches of its own {@code batch.size}, forever when that is above the topic's
     * {@code max.message.bytes} (KAFKA-8350): a remote topic's limit was lowered under the
     * stream's batches, and the driver reads the limits again when this grows.
     */
    long batchesSplit() {
      KafkaProducer<byte[], byte[]> producer = this.producer;
      return producer == null ? 0 : batchSplitTotal(producer) - splitBefore;
    }

    private static long batchSplitTotal(KafkaProducer<byte[], byte[]> producer) {
      try {
        for (Map.Entry<MetricName, ? extends Metric> metric : producer.metrics().entrySet()) {
          if (metric.getKey().name().equals("batch-split-total")
              && metric.getKey().group().equals("producer-metrics")) {
            return ((Number) metric.getValue().metricValue()).longValue();
          }
        }
      } catch (RuntimeException closed) { // a producer closing: nothing more to tell
        return 0;
      }
      return 0;
    }

    synchronized List<Copied> drain() {
      List<Copied> drained = new ArrayList<>();
      for (int i = 0; i < progress.size(); i++) {
        Copied copied = progress.get(i).drain(from.get(i));
        from.set(i, copied.next);
        drained.add(copied);
      }
      return drained;
    }
  }

  /**
   * Ends batch {@code batch} early: each of its ranges running in this JVM stops reading, waits
   * for its copies' acknowledgements and returns what it copied ({@link Copied#next}); ranges not
   * started yet copy nothing. Call {@link #forget} once the batch has returned.
   */
  public static void cancel(String batch) {
    CANCELLED.add(batch);
  }

  /** The batch has returned: its cancellation or stall, if any, is no longer needed. */
  public static void forget(String batch) {
    CANCELLED.remove(batch);
    STALLED.remove(batch);
    ALLOWED.remove(batch);
  }

  static boolean cancelled(String batch) {
    return batch != null && CANCELLED.contains(batch);
  }

  /**
   * Copies {@code ranges} ({@code topic\tpartition\tfrom\tuntil}, planned by the driver) on the
   * executors, one task per range. Returns the {@link Copied#encode encoded} results: records
   * copied, bytes of their keys, values and headers, and each range's runs of copies.
   *
   * <p>On a cluster with executors on several hosts, each source partition prefers the same host
   * batch after batch (a hash of its name), so the executor's cached consumer carries on from the
   * records it already fetched.
   */
  public static byte[] copy(JavaSparkContext spark, List<String> ranges, Map<String, String> settings) {
    if (ranges.isEmpty()) {
      return Copied.encode(List.of());
    }
    HashMap<String, String> shipped = new HashMap<>(settings);
    return Copied.encode(rangesRdd(spark, ranges).map(new CopyRange(shipped)).collect());
  }

  /**
   * Copies {@code ranges} as {@link #copy} does, but here, in the calling JVM (the driver's),
   * without a Spark job: for a small batch, scheduling a job costs more than the copy. Each range
   * runs the very task the executors run ({@link CopyRange}) on this JVM's cached clients, the
   * first on the calling thread and the others on their own threads, as concurrent tasks would.
   * Returns when every copy is acknowledged, the same results as {@link #copy}; a failed range
   * fails the call with its task's error (the first one, once all have ended).
   */
  public static byte[] copyLocal(List<String> ranges, Map<String, String> settings)
      throws Exception {
    CopyRange task = new CopyRange(new HashMap<>(settings));
    List<Future<Copied>> others = new ArrayList<>();
    for (String range : ranges.subList(Math.min(1, ranges.size()), ranges.size())) {
      others.add(LOCAL_TASKS.submit(() -> task.call(range)));
    }
    Exception failure = null;
    List<Copied> results = new ArrayList<>();
    try {
      if (!ranges.isEmpty()) {
        results.add(task.call(ranges.get(0)));
      }
    } catch (Exception e) {
      failure = e;
    }
    for (Future<Copied> other : others) {
      try {
        results.add(other.get());
      } catch (ExecutionException e) {
        if (failure == null) {
          failure = e.getCause() instanceof Exception cause ? cause : e;
        }
      }
    }
    if (failure != null) {
      throw failure;
    }
    return Copied.encode(results);
  }

  /**
   * What one range's task copied: records, bytes, and its runs of copies in target order, each
   * {first source offset, first target offset, count}, where both offsets advance by one per
   * copy (from the acknowledgements, which arrive in send order per partition).
   */
  static final class Copied implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    static final long NO_TIMESTAMP = Long.MIN_VALUE;
    long records;
    long bytes;
    /** The offset the range reached: its end, or, cancelled or stalled, the first not copied. */
    long next = -1;
    /** The source gave no record of the range for {@code poll.timeout.ms}: the range ended. */
    boolean stalled;
    /**
     * A stream's: when (epoch ms) a poll last found nothing new (its consumer at the end it saw)
     * with every copy sent by then acknowledged since (the partition was caught up then), -1
     * never; and the end of the partition its consumer last saw (-1 unknown). State, not
     * figures: {@link #drain} keeps them. A poll finding nothing new sets {@link #readAllAt};
     * a drain with no copy in flight makes it {@code caughtUpAt}. (Not the poll itself, with
     * none in flight: a heartbeat topic, read once a beat, brings a new heartbeat at every
     * beat, copied and still in flight as the poll ends; in a mesh, a flow was never seen
     * caught up.)
     */
    volatile long caughtUpAt = -1;
    volatile long readAllAt = -1;
    volatile long endSeen = -1;
    /** A stream's frontier: the offset after the last copy sent, the copies not acknowledged. */
    volatile long sentNext = -1;
    final java.util.concurrent.atomic.AtomicLong inFlight = new java.util.concurrent.atomic.AtomicLong();
    /** The offset after the last acknowledged copy (-1: none yet); records and bytes acknowledged. */
    private long ackedNext = -1;
    /**
     * The lowest source offset whose copy the target refused or never acknowledged (-1: none).
     * No position reaches past it: that record is copied again by the flow's next try.
     */
    private long failedAt = -1;
    private long ackedRecords;
    private long ackedBytes;
    /** Record age at read (now - record timestamp, ms): min, max, sum, count. */
    private final long[] age = {Long.MAX_VALUE, 0, 0, 0};
    /** Replication latency at acknowledgement (now - record timestamp, ms): min, max, sum, count. */
    private final long[] latency = {Long.MAX_VALUE, 0, 0, 0};
    private final List<long[]> runs = new ArrayList<>();
    private long runUp = -1;
    private long runDown = -1;
    private long runCount;

    /** A record was read {@code ms} after its timestamp (MirrorMaker 2's record-age-ms). */
    synchronized void read(long ms) {
      add(age, ms);
    }

    private static void add(long[] stats, long ms) {
      long value = Math.max(0, ms); // a timestamp ahead of this host's clock counts as 0
      stats[0] = Math.min(stats[0], value);
      stats[1] = Math.max(stats[1], value);
      stats[2] += value;
      stats[3]++;
    }

    /**
     * The copy of {@code upstream} is acknowledged at {@code downstream}, {@code latencyMs} after
     * its record's timestamp (MirrorMaker 2's replication-latency-ms; {@link #NO_TIMESTAMP}: the
     * record has none).
     */
    synchronized void acknowledged(long upstream, long downstream, long latencyMs, long size) {
      if (latencyMs != NO_TIMESTAMP) {
        add(latency, latencyMs);
      }
      ackedNext = upstream + 1;
      ackedRecords++;
      ackedBytes += size;
      if (runCount > 0 && upstream == runUp + runCount && downstream == runDown + runCount) {
        runCount++;
        return;
      }
      closeRun();
      runUp = upstream;
      runDown = downstream;
      runCount = 1;
    }

    /** The copy of {@code upstream} failed (its producer's callback had an error). */
    synchronized void failed(long upstream) {
      failedAt = failedAt < 0 ? upstream : Math.min(failedAt, upstream);
    }

    private void closeRun() {
      if (runCount > 0) {
        runs.add(new long[] {runUp, runDown, runCount});
        runCount = 0;
      }
    }

    /**
     * A running stream's figures since the last drain, taken out of this one: the records,
     * bytes, record ages and latencies acknowledged, and the runs of copies below the offset
     * every copy under which is acknowledged ({@link #next} of the result; {@code from} if
     * nothing is). Runs past it stay for the next drain, so the driver never stores a run of
     * the offset map above the position it writes.
     */
    Copied drain(long from) {
      long readAll = readAllAt; // each read before the copies in flight: see the class's notes
      long sent = sentNext;
      long pending = inFlight.get();
      Copied out = new Copied();
      synchronized (this) {
        if (pending == 0 && failedAt < 0 && readAll > caughtUpAt) {
          caughtUpAt = readAll; // what that poll's consumer had seen is all acknowledged now
        }
        long next = pending == 0 && sent >= 0 ? sent : ackedNext;
        if (failedAt >= 0) {
          // Copies past a failed one may have been acknowledged (another batch of the
          // partition): the position stays at the failed copy all the same.
          next = Math.min(next, failedAt);
        }
        out.next = Math.max(from, next);
        closeRun();
        List<long[]> kept = new ArrayList<>();
        for (long[] run : runs) {
          long below = Math.min(run[2], Math.max(0, out.next - run[0]));
          if (below > 0) {
            out.runs.add(new long[] {run[0], run[1], below});
          }
          if (below < run[2]) {
            kept.add(new long[] {run[0] + below, run[1] + below, run[2] - below});
          }
        }
        runs.clear();
        runs.addAll(kept);
        out.records = ackedRecords;
        out.bytes = ackedBytes;
        ackedRecords = 0;
        ackedBytes = 0;
        System.arraycopy(age, 0, out.age, 0, age.length);
        System.arraycopy(latency, 0, out.latency, 0, latency.length);
        age[0] = latency[0] = Long.MAX_VALUE;
        age[1] = age[2] = age[3] = latency[1] = latency[2] = latency[3] = 0;
      }
      out.caughtUpAt = caughtUpAt;
      out.endSeen = endSeen;
      return out;
    }

    /**
     * The results of ranges 0..n-1 as big-endian longs: total records, total bytes, n; then for
     * every range its bytes, record age min, max, sum, count, replication latency min, max, sum,
     * count (ms; min is Long.MAX_VALUE when count is 0), the offset it reached ({@link #next}),
     * 1 if it {@link #stalled} else 0, {@link #caughtUpAt} and {@link #endSeen}; then for every
     * run {range index, first source offset, first target offset, count}.
     */
    static byte[] encode(List<Copied> results) {
      return encode(results, 0);
    }

    /** {@code results} encoded, {@code batchesSplit} in the head (a stream's: see {@link
     * Stream#batchesSplit}). */
    static byte[] encode(List<Copied> results, long batchesSplit) {
      int runs = 0;
      for (Copied copied : results) {
        synchronized (copied) {
          copied.closeRun();
          runs += copied.runs.size();
        }
      }
      java.nio.ByteBuffer out =
          java.nio.ByteBuffer.allocate(32 + 104 * results.size() + 32 * runs);
      out.putLong(0).putLong(0).putLong(results.size()).putLong(batchesSplit);
      long records = 0;
      long bytes = 0;
      for (Copied copied : results) {
        out.putLong(copied.bytes);
        synchronized (copied) {
          for (long value : copied.age) {
            out.putLong(value);
          }
          for (long value : copied.latency) {
            out.putLong(value);
          }
        }
        out.putLong(copied.next).putLong(copied.stalled ? 1 : 0);
        out.putLong(copied.caughtUpAt).putLong(copied.endSeen);
      }
      for (int index = 0; index < results.size(); index++) {
        Copied copied = results.get(index);
        records += copied.records;
        bytes += copied.bytes;
        for (long[] run : copied.runs) {
          out.putLong(index).putLong(run[0]).putLong(run[1]).putLong(run[2]);
        }
      }
      out.putLong(0, records).putLong(8, bytes);
      return out.array();
    }
  }

  /** The ranges as an RDD of one partition each, with a preferred host per source partition. */
  private static JavaRDD<String> rangesRdd(JavaSparkContext spark, List<String> ranges) {
    List<String> hosts = executorHosts(spark);
    if (hosts.size() < 2) {
      return spark.parallelize(ranges, ranges.size());
    }
    List<Tuple2<String, scala.collection.immutable.Seq<String>>> located = new ArrayList<>();
    for (String range : ranges) {
      String[] fields = range.split("\t", 3);
      int slot = Math.floorMod((fields[0] + "-" + fields[1]).hashCode(), hosts.size());
      located.add(new Tuple2<>(range, CollectionConverters.asScala(List.of(hosts.get(slot))).toList()));
    }
    ClassTag<String> tag = ClassTag$.MODULE$.apply(String.class);
    return new JavaRDD<>(
        spark.sc().makeRDD(CollectionConverters.asScala(located).toList(), tag), tag);
  }

  /** The distinct hosts of the executors (the driver's left out), sorted. */
  private static List<String> executorHosts(JavaSparkContext spark) {
    if (spark.sc().isLocal()) {
      return List.of();
    }
    String driverHost = spark.getConf().get("spark.driver.host", "");
    TreeSet<String> hosts = new TreeSet<>();
    for (SparkExecutorInfo info : spark.sc().statusTracker().getExecutorInfos()) {
      hosts.add(info.host());
    }
    if (hosts.size() > 1) {
      hosts.remove(driverHost);
    }
    return new ArrayList<>(hosts);
  }

  /** One task: copy one offset range of one source partition. */
  static final class CopyRange implements Function<String, Copied> {
    private static final long serialVersionUID = 1L;
    private final HashMap<String, String> settings;

    CopyRange(HashMap<String, String> settings) {
      this.settings = settings;
    }

    @Override
    public Copied call(String range) throws Exception {
      return call(range, new Copied());
    }

    /** Copies {@code range} into {@code copied}. */
    Copied call(String range, Copied copied) throws Exception {
      String[] fields = range.split("\t");
      TopicPartition tp = new TopicPartition(fields[0], Integer.parseInt(fields[1]));
      long from = Long.parseLong(fields[2]);
      long until = Long.parseLong(fields[3]);
      String remote = settings.get("topic." + tp.topic());
      if (remote == null) {
        copied.next = until; // matched the subscription's pattern but not the flow's filters
        return copied;
      }
      Map<String, Object> consumerConfig = consumerConfig();
      PartitionReader reader = KafkaClients.borrow(consumerConfig, tp);
      boolean healthy = false;
      try {
        copy(reader, tp, from, until, remote, copied);
        healthy = true;
        return copied;
      } finally {
        if (healthy) {
          KafkaClients.release(consumerConfig, tp, reader);
        } else {
          reader.close();
        }
      }
    }

    private void copy(
        PartitionReader reader, TopicPartition tp, long from, long until, String remote, Copied copied)
        throws Exception {
      long pollTimeoutMs = Long.parseLong(settings.getOrDefault("poll.timeout.ms", "120000"));
      Sender sender = new Sender();
      AtomicReference<Exception> failure = sender.failure;
      reader.seek(from);
      long next = from;
      long records = 0;
      long bytes = 0;
      long lastProgress = System.currentTimeMillis();
      String batch = settings.get("batch");
      boolean cancelled = false;
      while (next < until && failure.get() == null) {
        if (cancelled(batch)) {
          cancelled = true; // the flow was paused or held: stop here, keep what is copied
          break;
        }
        if (batch != null && STALLED.contains(batch)) {
          copied.stalled = true; // another range of the batch found the source silent
          break;
        }
        List<ConsumerRecord<byte[], byte[]>> polled;
        try {
          polled = reader.poll(Duration.ofMillis(500));
        } catch (AuthenticationException | AuthorizationException refused) {
          throw refusedBy("source", "reading " + tp, refused, "READ on topic " + tp.topic());
        } catch (OffsetOutOfRangeException gone) {
          long earliest = reader.earliest();
          LOG.warn(
              "{}: offsets {} to {} are no longer on {} (retention or truncation); copying from {}",
              tp, next, earliest - 1, settings.get("source"), Math.min(earliest, until));
          if (earliest >= until) {
            next = until; // nothing of the range is left on the source
            break;
          }
          next = earliest;
          reader.seekAfterLoss(next);
          continue;
        }
        if (polled.isEmpty()) {
          if (reader.position() >= until) {
            next = until; // the rest of the range holds no records for us (markers, aborts)
            break;
          }
          if (System.currentTimeMillis() - lastProgress > pollTimeoutMs) {
            // The source stopped answering: keep what is copied, the driver retries the rest.
            copied.stalled = true;
            if (batch != null) {
              STALLED.add(batch);
            }
            break;
          }
          continue;
        }
        lastProgress = System.currentTimeMillis();
        long readAt = lastProgress;
        for (int i = 0; i < polled.size(); i++) {
          ConsumerRecord<byte[], byte[]> record = polled.get(i);
          if (record.offset() >= until) {
            reader.endRange(until, polled.subList(i, polled.size()));
            next = until;
            break;
          }
          long size = sender.send(record, tp, remote, copied, readAt);
          if (size == Sender.DROPPED) {
            next = record.offset() + 1; // dropped by the flow's transforms: a gap, not a copy
            continue;
          }
          if (size == Sender.FAILED) {
            break;
          }
          long upstream = record.offset();
          records++;
          bytes += size;
          next = upstream + 1;
        }
      }
      if (next >= until) {
        reader.endRangeIfOpen(until);
      } else if (cancelled || copied.stalled) {
        reader.endRangeIfOpen(next); // the next range of the partition starts here
        LOG.info(
            "{}: batch {} {} at offset {} of {}..{}",
            tp, batch, cancelled ? "cancelled" : "stalled (no record from the source)", next, from, until);
      }
      sender.flush(tp, remote);
      copied.records = records;
      copied.bytes = bytes;
      copied.next = Math.min(next, until);
    }

    /**
     * Copies the partitions of {@code stream} continuously from where each starts, each into its
     * {@link Copied} (which {@link Copied#drain} reads while it runs), with one consumer for them
     * all, taking the partitions added to the stream at each poll, until the stream's batch is
     * cancelled or a copy fails. A partition the flow does not copy (its topic matched the
     * subscription but not the flow's filters) stays where it is.
     *
     * <p>Its paced partitions ({@code paced.<topic>}: the driver marks the flow's heartbeat topics)
     * are read by a consumer of their own, polled without waiting once every {@link
     * #STREAM_PACED_MS}: what arrived since its last beat comes
     * in one fetch and goes out in one request. In a mesh every cluster holds hundreds of heartbeat
     * topics (each flow's heartbeats, copied along every chain of flows), a heartbeat a second
     * each: read as they arrive, every stream fetched and produced for a record or two at a time
     * all day. A heartbeat's copy waits at most two beats.
     */
    Void stream(Stream stream) throws Exception {
      Map<TopicPartition, Copied> copied = new HashMap<>();
      Map<TopicPartition, String> remotes = new HashMap<>();
      Map<TopicPartition, Long> next = new HashMap<>();
      String batch = settings.get("batch");
      AtomicLong allowed = ALLOWED.get(batch);
      // Records as they arrive; the paced ones (heartbeat topics) once every STREAM_PACED_MS.
      StreamReader prompt = new StreamReader(false);
      StreamReader paced = new StreamReader(true);
      long pacedAt = 0; // when the paced reader is polled next (epoch ms)
      long unknownSince = 0; // since when a paced partition's end is unknown (epoch ms; 0: known)
      Sender sender = null;
      boolean failed = false;
      try {
        while (!failed
            && !stream.ended
            && !cancelled(batch)
            && (sender == null || sender.failure.get() == null)) {
          for (Stream.Added added; (added = stream.added.poll()) != null; ) {
            settings.putAll(added.names());
            for (int i = 0; i < added.partitions().size(); i++) {
              TopicPartition tp = added.partitions().get(i);
              String remote = settings.get("topic." + tp.topic());
              if (remote != null) {
                copied.put(tp, added.progress().get(i));
                remotes.put(tp, remote);
                next.put(tp, added.progress().get(i).sentNext);
                ("true".equals(settings.get("paced." + tp.topic())) ? paced : prompt).add(tp);
              }
            }
          }
          if (copied.isEmpty()) { // nothing to read (yet): wait for partitions or the end
            Thread.sleep(100);
            continue;
          }
          if (sender == null) {
            sender = new Sender();
            stream.producer(sender.producer);
          }
          prompt.assign(next);
          paced.assign(next);
          if (allowed != null && System.currentTimeMillis() > allowed.get()) {
            Thread.sleep(20); // not allowed to copy now (see ALLOWED): wait for the driver
            continue;
          }
          long now = System.currentTimeMillis();
          if (paced.consumer != null && now >= pacedAt) {
            pacedAt = now + STREAM_PACED_MS;
            // Without waiting: what its fetch sent at the last beat brought (all of it, not one
            // poll's max.poll.records: a backlog of heartbeats catches up at once), and the next
            // fetch.
            int polled;
            do {
              polled = read(paced, Duration.ZERO, stream, sender, copied, remotes, next, allowed);
            } while (polled >= paced.maxPollRecords && !stream.ended);
            failed = polled < 0;
            Ends ends = failed ? Ends.CAUGHT_UP : paced.ends();
            unknownSince = ends != Ends.UNKNOWN ? 0 : unknownSince == 0 ? now : unknownSince;
            if (ends == Ends.BEHIND
                || (ends == Ends.UNKNOWN && now - unknownSince < STREAM_PACED_UNKNOWN_MS)) {
              pacedAt = now + STREAM_PACED_BEHIND_MS; // read on until caught up
            }
          }
          if (failed) {
            break;
          }
          long waitMs = paced.consumer == null ? 500 : Math.max(0, Math.min(500, pacedAt - now));
          if (prompt.consumer != null) {
            failed = read(prompt, Duration.ofMillis(waitMs), stream, sender, copied, remotes, next, allowed) < 0;
          } else {
            Thread.sleep(Math.min(100, waitMs));
          }
        }
      } finally {
        prompt.close();
        paced.close();
      }
      if (sender != null) {
        try {
          // Every copy acknowledged, or the first failure thrown; or, past the grace, the copies
          // still in flight left to the producer, the positions staying before them.
          sender.settle(copied, remotes, stream.graceMs);
        } finally {
          if (stream.batchesSplit() > 0) {
            // Its refused batches split forever (KAFKA-8350), even once the limit is raised
            // again, until its network thread dies of it (StackOverflowError): a stream whose
            // producer has these settings again must not take this one from the pool.
            KafkaClients.discardProducer(sender.producerConfig);
          }
        }
      }
      for (Map.Entry<TopicPartition, Copied> entry : copied.entrySet()) {
        entry.getValue().next = next.get(entry.getKey());
      }
      return null;
    }

    /** What a stream reader's partitions' ends tell (see {@link StreamReader#ends}). */
    private enum Ends {
      /** Its consumer is at every end it knows, and knows them all. */
      CAUGHT_UP,
      /** Records past its consumer's position in one of them. */
      BEHIND,
      /** None behind, but one's end not known yet: no fetch of it answered. */
      UNKNOWN
    }

    /**
     * One of a stream's consumers and the partitions it reads: a stream reads its partitions'
     * records as they arrive with one, and its paced partitions' with another, polled once a
     * beat.
     */
    private final class StreamReader {
      final Set<TopicPartition> partitions = new java.util.LinkedHashSet<>();
      KafkaConsumer<byte[], byte[]> consumer;
      /** Its consumer's max.poll.records: a poll that returned as many may have left more. */
      int maxPollRecords = ConsumerConfig.DEFAULT_MAX_POLL_RECORDS;
      private boolean added;
      /** Polled without waiting once a beat: its fetches are small (STREAM_PACED_FETCH_BYTES). */
      private final boolean paced;

      StreamReader(boolean paced) {
        this.paced = paced;
      }

      void add(TopicPartition tp) {
        added |= partitions.add(tp);
      }

      /** Its consumer reads its partitions (new ones from {@code next}) once some were added. */
      void assign(Map<TopicPartition, Long> next) {
        if (!added) {
          return;
        }
        if (consumer == null) {
          Map<String, Object> config = consumerConfig();
          Object most = config.get(ConsumerConfig.MAX_POLL_RECORDS_CONFIG);
          if (most != null) {
            maxPollRecords = Integer.parseInt(most.toString());
          }
          if (paced) {
            config.put(ConsumerConfig.FETCH_MAX_BYTES_CONFIG, STREAM_PACED_FETCH_BYTES);
            config.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, STREAM_PACED_FETCH_BYTES);
          }
          consumer = new KafkaConsumer<>(config);
        }
        consumer.assign(partitions);
        for (TopicPartition tp : partitions) {
          consumer.seek(tp, next.get(tp));
        }
        added = false;
      }

      /** What its partitions' ends, as far as its consumer's last fetches saw them, tell. */
      Ends ends() {
        Ends ends = Ends.CAUGHT_UP;
        for (TopicPartition tp : consumer == null ? Set.<TopicPartition>of() : partitions) {
          java.util.OptionalLong lag = consumer.currentLag(tp);
          if (lag.isEmpty()) {
            ends = Ends.UNKNOWN;
          } else if (lag.getAsLong() > 0) {
            return Ends.BEHIND;
          }
        }
        return ends;
      }

      void close() {
        if (consumer != null) {
          consumer.close(Duration.ofSeconds(5));
        }
      }
    }

    /**
     * One poll of {@code reader}'s consumer (waiting at most {@code wait}) and the copies of what
     * it returned; then its partitions' progress: where each is, the end its consumer saw, when
     * it was caught up. Returns how many records the poll returned, or -1 when a copy failed (the
     * sender holds why).
     */
    private int read(
        StreamReader reader,
        Duration wait,
        Stream stream,
        Sender sender,
        Map<TopicPartition, Copied> copied,
        Map<TopicPartition, String> remotes,
        Map<TopicPartition, Long> next,
        AtomicLong allowed) {
      KafkaConsumer<byte[], byte[]> consumer = reader.consumer;
      ConsumerRecords<byte[], byte[]> polled;
      try {
        polled = consumer.poll(wait);
      } catch (AuthenticationException | AuthorizationException refused) {
        throw refusedBy("source", "reading " + reader.partitions, refused, "READ on its topics");
      } catch (OffsetOutOfRangeException gone) {
        for (Map.Entry<TopicPartition, Long> lost : gone.offsetOutOfRangePartitions().entrySet()) {
          TopicPartition tp = lost.getKey();
          long earliest = consumer.beginningOffsets(List.of(tp)).get(tp);
          LOG.warn(
              "{}: offsets {} to {} are no longer on {} (retention or truncation); copying from {}",
              tp, lost.getValue(), earliest - 1, settings.get("source"), earliest);
          next.put(tp, earliest);
          consumer.seek(tp, earliest);
        }
        return 0;
      }
      long readAt = System.currentTimeMillis();
      Set<TopicPartition> held = new java.util.HashSet<>();
      boolean failed = false;
      for (TopicPartition tp : polled.partitions()) {
        for (ConsumerRecord<byte[], byte[]> record : polled.records(tp)) {
          if (stream.ended || allowed != null && System.currentTimeMillis() > allowed.get()) {
            consumer.seek(tp, record.offset()); // copied once allowed again
            held.add(tp);
            break;
          }
          if (sender.send(record, tp, remotes.get(tp), copied.get(tp), readAt) == Sender.FAILED) {
            failed = true;
            break;
          }
          next.put(tp, record.offset() + 1); // a copy sent, or a gap: dropped by the transforms
        }
        if (failed) {
          break;
        }
      }
      for (TopicPartition tp : reader.partitions) {
        Copied progress = copied.get(tp);
        if (!failed && !held.contains(tp)) {
          // Past the last record returned: offsets holding no record for us (transaction
          // markers, aborted or compacted records) up to the consumer's position.
          next.put(tp, Math.max(next.get(tp), consumer.position(tp)));
        }
        progress.sentNext = next.get(tp);
        java.util.OptionalLong lag = consumer.currentLag(tp);
        if (lag.isPresent()) {
          progress.endSeen = next.get(tp) + lag.getAsLong();
          if (lag.getAsLong() == 0) {
            progress.readAllAt = readAt; // caught up once its copies are acknowledged (drain)
          }
        }
      }
      return failed ? -1 : polled.count();
    }

    /** The copies of one task: its producer, offset syncs, transforms and first failure. */
    private final class Sender {
      static final long DROPPED = -1;
      static final long FAILED = -2;
      final AtomicReference<Exception> failure = new AtomicReference<>();
      private volatile TopicPartition failedPartition; // of the first failure
      private volatile String failedRemote;
      private final long overhead = Long.parseLong(settings.getOrDefault("record.overhead", "0"));
      private final Map<String, Object> producerConfig = clientConfig("producer.");
      private final KafkaProducer<byte[], byte[]> producer = KafkaClients.producer(producerConfig);
      private final OffsetSyncWriter syncs = syncWriter();
      private final RecordTransform transform;
      private final Map<String, Long> limits = new HashMap<>();

      Sender() throws Exception {
        String plan = settings.get("transform");
        transform = plan == null
            ? null
            : RecordTransform.decode(
                plan,
                "true".equals(settings.get("transform.headers")),
                "true".equals(settings.get("transform.record")));
      }

      /**
       * Sends the copy of {@code record} (of {@code tp}) to {@code remote}: its size; {@link
       * #DROPPED} if the flow's transforms drop it; {@link #FAILED} if the producer refused it
       * ({@link #failure} says why). A record larger than the remote topic takes fails the task.
       */
      long send(
          ConsumerRecord<byte[], byte[]> record, TopicPartition tp, String remote, Copied copied,
          long readAt) {
        byte[] key = record.key();
        byte[] value = record.value();
        Headers headers = record.headers();
        if (transform != null) {
          RecordTransform.Result result = transform.apply(record, remote);
          if (result == null) {
            return DROPPED;
          }
          key = result.key;
          value = result.value;
          headers = result.headers;
        }
        long size = size(key, value, headers);
        long limit = limits.computeIfAbsent(remote, r -> Long.parseLong(settings.get("limit." + r)));
        if (size + overhead > limit) {
          producer.flush();
          throw new IllegalStateException(
              settings.get("error.prefix") + "record " + tp + "@" + record.offset() + " (" + size
                  + " bytes) is larger than max.message.bytes=" + limit + " of " + remote
                  + " on " + settings.get("target")
                  + "; raise max.message.bytes on the target topic (nothing after it was copied)");
        }
        long upstream = record.offset();
        long timestamp = record.timestamp();
        if (timestamp >= 0) {
          copied.read(readAt - timestamp);
        }
        copied.inFlight.incrementAndGet();
        try {
          producer.send(
              new ProducerRecord<>(
                  remote, tp.partition(), timestamp >= 0 ? timestamp : null, key, value, headers),
              (metadata, error) -> {
                if (error != null) {
                  copied.failed(upstream); // before inFlight drops: see Copied#drain
                  failed(error, tp, remote);
                  if (syncs != null) {
                    syncs.failed(tp);
                  }
                } else if (metadata.hasOffset()) {
                  copied.acknowledged(
                      upstream,
                      metadata.offset(),
                      timestamp >= 0 ? System.currentTimeMillis() - timestamp : Copied.NO_TIMESTAMP,
                      size);
                  if (syncs != null) {
                    syncs.acknowledged(tp, upstream, metadata.offset());
                  }
                }
                copied.inFlight.decrementAndGet();
              });
        } catch (KafkaException refusedOrFailed) { // a producer in a failed state throws here
          copied.inFlight.decrementAndGet();
          failed(refusedOrFailed, tp, remote);
          return FAILED;
        }
        return size;
      }

      private void failed(Exception error, TopicPartition tp, String remote) {
        if (failure.compareAndSet(null, error)) {
          failedPartition = tp;
          failedRemote = remote;
        }
      }

      /**
       * Waits for every copy sent to be acknowledged; throws the first failure in one line,
       * naming the partition it failed for ({@code tp} and {@code remote} if not known).
       */
      void flush(TopicPartition tp, String remote) {
        producer.flush();
        raise(tp, remote);
      }

      /**
       * A stream's end: waits up to {@code graceMs} for the acknowledgement of each copy this
       * stream sent (its partitions' copies in flight, not a {@code flush} of its producer,
       * which waits until {@code delivery.timeout.ms}), as MirrorMaker 2's {@code
       * task.shutdown.graceful.timeout.ms} bounds a task's stop; then throws the first failure, as {@link #flush}. Copies still not
       * acknowledged are left to the producer (which delivers or expires them) and logged: their
       * partitions' positions stay before them ({@link Copied#drain}: the offset after the last
       * acknowledged copy), so the flow's next start copies them again.
       */
      void settle(Map<TopicPartition, Copied> copied, Map<TopicPartition, String> remotes, long graceMs)
          throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(graceMs);
        Map<TopicPartition, Long> pending = new java.util.TreeMap<>(
            java.util.Comparator.comparing(TopicPartition::toString));
        while (failure.get() == null) {
          pending.clear();
          for (Map.Entry<TopicPartition, Copied> entry : copied.entrySet()) {
            long inFlight = entry.getValue().inFlight.get();
            if (inFlight > 0) {
              pending.put(entry.getKey(), inFlight);
            }
          }
          if (pending.isEmpty() || System.nanoTime() >= deadline) {
            break;
          }
          Thread.sleep(5);
        }
        TopicPartition any = copied.keySet().iterator().next();
        raise(any, remotes.get(any));
        if (!pending.isEmpty()) {
          long copies = pending.values().stream().mapToLong(Long::longValue).sum();
          StringBuilder where = new StringBuilder();
          for (TopicPartition tp : pending.keySet()) {
            where.append(where.length() == 0 ? "" : ", ")
                .append(remotes.get(tp)).append('-').append(tp.partition());
          }
          LOG.warn(
              "{}->{}: the stream ended with {} copies not acknowledged by {} within "
                  + "task.shutdown.graceful.timeout.ms={} ({}): the positions stay before them, "
                  + "so the flow's next start copies them again",
              settings.get("source"), settings.get("target"), copies, settings.get("target"),
              graceMs, where);
        }
      }

      /** Throws the first failure in one line, as {@link #flush}; nothing if none. */
      private void raise(TopicPartition tp, String remote) {
        Exception error = failure.get();
        if (error == null) {
          return;
        }
        KafkaClients.discardProducer(producerConfig);
        if (failedPartition != null) {
          tp = failedPartition;
          remote = failedRemote;
        }
        for (Throwable cause = error; cause != null; cause = cause.getCause()) {
          if (cause instanceof AuthenticationException || cause instanceof AuthorizationException) {
            throw refusedBy(
                "target", "writing " + remote + "-" + tp.partition(), (Exception) cause,
                "WRITE on topic " + remote);
          }
        }
        throw new IllegalStateException(
            settings.get("error.prefix") + "copying " + tp + " to " + remote + " on "
                + settings.get("target") + " failed: " + error,
            error);
      }
    }

    /**
     * One line naming the cluster and the principal it refused, what was being done and what to
     * check: the ACL ({@code needs}, operation and resource) if the cluster refused an operation.
     */
    private IllegalStateException refusedBy(
        String side, String action, Exception error, String needs) {
      String cluster = settings.get(side);
      String principal = settings.getOrDefault(side + ".principal", "(no SASL user)");
      boolean acl = error instanceof AuthorizationException;
      String hint = acl
          ? "add that ACL for User:" + principal + " on " + cluster
          : "check the credentials and ACLs of " + principal + " on " + cluster;
      return new IllegalStateException(
          settings.get("error.prefix") + "cluster " + cluster + " refused principal " + principal + " while "
              + action + (acl ? ", which needs " + needs : "") + ": " + error.getMessage()
              + " (" + hint + ")",
          error);
    }

    private static long size(byte[] key, byte[] value, Headers headers) {
      long size = (key == null ? 0 : key.length) + (value == null ? 0 : value.length);
      for (Header header : headers) {
        size += header.key().getBytes(StandardCharsets.UTF_8).length;
        size += header.value() == null ? 0 : header.value().length;
      }
      return size;
    }

    private Map<String, Object> consumerConfig() {
      Map<String, Object> config = clientConfig("consumer.");
      config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
      config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
      config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
      config.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
      config.remove(ConsumerConfig.GROUP_ID_CONFIG);
      return config;
    }

    private OffsetSyncWriter syncWriter() {
      String topic = settings.get("syncs.topic");
      if (topic == null) {
        return null;
      }
      Map<String, Object> config = clientConfig("syncs.producer.");
      config.put(ProducerConfig.ACKS_CONFIG, "all");
      config.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
      try {
        return OffsetSyncWriter.shared(
            topic,
            Long.parseLong(settings.get("syncs.lag.max")),
            Long.parseLong(settings.get("syncs.interval.ms")),
            config);
      } catch (AuthenticationException | AuthorizationException refused) {
        throw refusedBy("syncs", "writing offset syncs to " + topic, refused, "WRITE on topic " + topic);
      }
    }

    private Map<String, Object> clientConfig(String prefix) {
      Map<String, Object> config = new HashMap<>();
      for (Map.Entry<String, String> entry : settings.entrySet()) {
        if (entry.getKey().startsWith(prefix)) {
          config.put(entry.getKey().substring(prefix.length()), entry.getValue());
        }
      }
      if (!prefix.equals("consumer.")) {
        config.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        config.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
      }
      return config;
    }
  }
}
